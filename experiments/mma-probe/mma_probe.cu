// mma-probe: what this GPU's tensor cores and FP8 conversions return, written as vector files that `qattn mma-check`
// reads (docs/mma.md "Vector files"). Run it on the GPU, then check the models against what it wrote:
//
//   nvcc -O2 -std=c++17 -arch=sm_90 mma_probe.cu -lcublasLt -o mma-probe    (sm_89 for Ada, sm_80 for A100)
//   ./mma-probe OUT_DIR [--tests N] [--seed S]
//   qattn mma-check OUT_DIR/mma_sync_m16n8k16_f16f32.safetensors --model h100-hmma-f16
//
// What it issues, each only where the GPU has it (compute capability in parentheses):
//   mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32     (8.0)  mma_sync_m16n8k16_f16f32.safetensors
//   mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32   (8.0)  mma_sync_m16n8k16_bf16f32.safetensors
//   mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16     (8.0)  mma_sync_m16n8k16_f16f16.safetensors
//   mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32   (8.9)  mma_sync_m16n8k32_e4m3.safetensors
//   cuBLASLt FP8 E4M3 GEMM, fast accumulation and default (8.9; wgmma on 9.0)  wgmma_cublaslt_e4m3.safetensors
//   cvt.rn.satfinite.{e4m3,e5m2}x2.f32 over all 2^32 patterns (8.9)       cvt_satfinite_transitions.txt
//
// Sets of each mma.sync file (`tests` tests each, inputs from a seeded std::mt19937_64 on the host):
//   exact      small integers, every sum exact in float32: D must equal the exact sum (checks the fragment layout;
//              the probe stops with an error when it does not)
//   zero       A = B = 0, C random bit patterns (for f16: random finite f16)
//   random     random inputs, exponents 2^-8 ... 2^6 (2^4 for the f16 accumulator); FP8: every non-NaN code
//   subnormal  16-bit inputs only: A half subnormal, half small normals; B over 2^-2 ... 2^8 (how E reads subnormals)
// Bt holds B transposed (row n = column n of B). The files are .safetensors, which every qattn build reads.
#include <cuda.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#if __has_include(<cublasLt.h>)
#include <cublasLt.h>
#define PROBE_HAVE_CUBLASLT 1
#endif

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "mma-probe: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// --- safetensors writer ---------------------------------------------------------------------------------------
struct Member {
  std::string name, dtype;  // "U8", "U16", "F32", "F16"
  std::vector<long long> shape;
  std::vector<unsigned char> bytes;
};

template <class T>
Member member(const std::string& name, const char* dtype, std::vector<long long> shape, const std::vector<T>& v) {
  Member m{name, dtype, std::move(shape), std::vector<unsigned char>(v.size() * sizeof(T))};
  std::memcpy(m.bytes.data(), v.data(), m.bytes.size());
  return m;
}

void write_safetensors(const std::string& path, const std::vector<Member>& members) {
  std::string header = "{";
  std::size_t offset = 0;
  for (std::size_t i = 0; i < members.size(); ++i) {
    const Member& m = members[i];
    header += (i ? ",\"" : "\"") + m.name + "\":{\"dtype\":\"" + m.dtype + "\",\"shape\":[";
    for (std::size_t d = 0; d < m.shape.size(); ++d) header += (d ? "," : "") + std::to_string(m.shape[d]);
    header += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + m.bytes.size()) + "]}";
    offset += m.bytes.size();
  }
  header += "}";
  while (header.size() % 8 != 0) header += ' ';
  std::ofstream out(path, std::ios::binary);
  const unsigned long long n = header.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  for (const Member& m : members) out.write(reinterpret_cast<const char*>(m.bytes.data()), static_cast<std::streamsize>(m.bytes.size()));
  if (!out) {
    std::fprintf(stderr, "mma-probe: %s: write failed\n", path.c_str());
    std::exit(1);
  }
  std::printf("wrote %s\n", path.c_str());
}

// --- host-side formats ----------------------------------------------------------------------------------------
float e4m3_value(std::uint8_t c) {
  const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  const float v = e == 0 ? std::ldexp(static_cast<float>(m), -9) : std::ldexp(1.0f + m / 8.0f, e - 7);
  return s ? -v : v;
}
std::uint8_t e4m3_code(int integer) {  // small integers, |x| <= 15 (exact in E4M3)
  for (int c = 0; c < 256; ++c)
    if ((c & 0x7f) != 0x7f && e4m3_value(static_cast<std::uint8_t>(c)) == static_cast<float>(integer))
      return static_cast<std::uint8_t>(c);
  return 0;
}
float half_value(std::uint16_t h, bool bf16) {
  if (bf16) {
    const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  const float v = e == 0 ? std::ldexp(static_cast<float>(m), -24) : std::ldexp(1.0f + m / 1024.0f, e - 15);
  return s ? -v : v;
}
std::uint16_t half_bits(float x, bool bf16) {  // x exact in the format (small integers, or built from fields)
  if (bf16) {
    std::uint32_t u;
    std::memcpy(&u, &x, 4);
    return static_cast<std::uint16_t>(u >> 16);
  }
  return __half_as_ushort(__float2half_rn(x));
}
// A random 16-bit value with exponent in [lo, hi], random sign and mantissa.
std::uint16_t random_half(std::mt19937_64& g, int lo, int hi, bool bf16) {
  const int e = std::uniform_int_distribution<int>(lo, hi)(g);
  const int mbits = bf16 ? 7 : 10;
  const unsigned m = static_cast<unsigned>(g()) & ((1u << mbits) - 1);
  const float v = std::ldexp(1.0f + static_cast<float>(m) / static_cast<float>(1u << mbits), e) * (g() & 1 ? -1.0f : 1.0f);
  return half_bits(v, bf16);
}
float random_c(std::mt19937_64& g) {  // over 2^-12 ... 2^18, a quarter zeros
  if (g() % 4 == 0) return 0.0f;
  const int e = std::uniform_int_distribution<int>(-12, 17)(g);
  return std::ldexp(1.0f + static_cast<float>(g() % 8388608) / 8388608.0f, e) * (g() & 1 ? -1.0f : 1.0f);
}

// --- mma.sync kernels: one test per warp ----------------------------------------------------------------------
// Fragments (PTX ISA, "Matrix fragments for mma.m16n8k16 / m16n8k32"): g = lane / 4, t = lane % 4.
//   16-bit A (16 x 16): a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]
//   16-bit B (16 x 8):  b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]
//   8-bit A (16 x 32):  a0 = A[g][4t..4t+3], a1 = A[g+8][4t..], a2 = A[g][16+4t..], a3 = A[g+8][16+4t..]
//   8-bit B (32 x 8):   b0 = B[4t..4t+3][g], b1 = B[16+4t..16+4t+3][g]
//   f32 C/D (16 x 8):   c0 = C[g][2t], c1 = C[g][2t+1], c2 = C[g+8][2t], c3 = C[g+8][2t+1]
//   f16 C/D:            c0 = C[g][2t..2t+1], c1 = C[g+8][2t..2t+1]
// The lower-numbered element sits in the lower bits of a register.
__device__ std::uint32_t pack16(const std::uint16_t* p) { return p[0] | (static_cast<std::uint32_t>(p[1]) << 16); }
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 890  // FP8 mma.sync: sm_89 and later
__device__ std::uint32_t pack8(const std::uint8_t* p) {
  return p[0] | (p[1] << 8) | (p[2] << 16) | (static_cast<std::uint32_t>(p[3]) << 24);
}
#endif

template <int kKind>  // 0: f16 -> f32, 1: bf16 -> f32, 2: f16 -> f16
__global__ void mma_k16(const std::uint16_t* a, const std::uint16_t* bt, const std::uint16_t* c_bits,
                        std::uint16_t* d_bits, const float* c, float* d) {
  const int test = blockIdx.x, lane = threadIdx.x, g = lane / 4, t = lane % 4;
  const std::uint16_t* A = a + test * 256;
  const std::uint16_t* B = bt + test * 128;  // Bt[n][k]: B[k][n] = Bt[n][k]
  const std::uint32_t a0 = pack16(A + g * 16 + 2 * t), a1 = pack16(A + (g + 8) * 16 + 2 * t),
                      a2 = pack16(A + g * 16 + 2 * t + 8), a3 = pack16(A + (g + 8) * 16 + 2 * t + 8);
  const std::uint32_t b0 = pack16(B + g * 16 + 2 * t), b1 = pack16(B + g * 16 + 2 * t + 8);
  if constexpr (kKind == 2) {
    const std::uint16_t* C = c_bits + test * 128;
    std::uint32_t c0 = pack16(C + g * 8 + 2 * t), c1 = pack16(C + (g + 8) * 8 + 2 * t), d0, d1;
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%0,%1}, {%2,%3,%4,%5}, {%6,%7}, {%8,%9};\n"
                 : "=r"(d0), "=r"(d1)
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(c0), "r"(c1));
    std::uint16_t* D = d_bits + test * 128;
    D[g * 8 + 2 * t] = d0 & 0xffff, D[g * 8 + 2 * t + 1] = d0 >> 16;
    D[(g + 8) * 8 + 2 * t] = d1 & 0xffff, D[(g + 8) * 8 + 2 * t + 1] = d1 >> 16;
  } else {
    const float* C = c + test * 128;
    float d0, d1, d2, d3;
    const float c0 = C[g * 8 + 2 * t], c1 = C[g * 8 + 2 * t + 1], c2 = C[(g + 8) * 8 + 2 * t],
                c3 = C[(g + 8) * 8 + 2 * t + 1];
    if constexpr (kKind == 0)
      asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                   "{%10,%11,%12,%13};\n"
                   : "=f"(d0), "=f"(d1), "=f"(d2), "=f"(d3)
                   : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(c0), "f"(c1), "f"(c2), "f"(c3));
    else
      asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                   "{%10,%11,%12,%13};\n"
                   : "=f"(d0), "=f"(d1), "=f"(d2), "=f"(d3)
                   : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(c0), "f"(c1), "f"(c2), "f"(c3));
    float* D = d + test * 128;
    D[g * 8 + 2 * t] = d0, D[g * 8 + 2 * t + 1] = d1, D[(g + 8) * 8 + 2 * t] = d2, D[(g + 8) * 8 + 2 * t + 1] = d3;
  }
}

__global__ void mma_k32_e4m3(const std::uint8_t* a, const std::uint8_t* bt, const float* c, float* d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  const int test = blockIdx.x, lane = threadIdx.x, g = lane / 4, t = lane % 4;
  const std::uint8_t* A = a + test * 512;
  const std::uint8_t* B = bt + test * 256;
  const std::uint32_t a0 = pack8(A + g * 32 + 4 * t), a1 = pack8(A + (g + 8) * 32 + 4 * t),
                      a2 = pack8(A + g * 32 + 16 + 4 * t), a3 = pack8(A + (g + 8) * 32 + 16 + 4 * t);
  const std::uint32_t b0 = pack8(B + g * 32 + 4 * t), b1 = pack8(B + g * 32 + 16 + 4 * t);
  const float* C = c + test * 128;
  float d0, d1, d2, d3;
  asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%10,%11,%12,%13};\n"
               : "=f"(d0), "=f"(d1), "=f"(d2), "=f"(d3)
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(C[g * 8 + 2 * t]), "f"(C[g * 8 + 2 * t + 1]),
                 "f"(C[(g + 8) * 8 + 2 * t]), "f"(C[(g + 8) * 8 + 2 * t + 1]));
  float* D = d + test * 128;
  D[g * 8 + 2 * t] = d0, D[g * 8 + 2 * t + 1] = d1, D[(g + 8) * 8 + 2 * t] = d2, D[(g + 8) * 8 + 2 * t + 1] = d3;
#endif
}

// --- cvt.rn.satfinite over every float32 -----------------------------------------------------------------------
// out[u] for u in [base, base + n): the code of float32 pattern u (the low byte of the x2 result).
__global__ void cvt_all(std::uint32_t base, std::uint32_t n, int e5m2, std::uint8_t* out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  const std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float x = __uint_as_float(base + i);
  unsigned short r;
  if (e5m2) asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %1;" : "=h"(r) : "f"(x));
  else asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %1;" : "=h"(r) : "f"(x));
  out[i] = static_cast<std::uint8_t>(r & 0xff);
#endif
}

template <class T>
T* to_device(const std::vector<T>& v) {
  T* p = nullptr;
  check(cudaMalloc(&p, v.size() * sizeof(T) + 1), "cudaMalloc");
  check(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  return p;
}
template <class T>
std::vector<T> from_device(const T* p, std::size_t n) {
  std::vector<T> v(n);
  check(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy");
  return v;
}

// One 16-bit mma.sync file: kind 0 f16 -> f32, 1 bf16 -> f32, 2 f16 -> f16.
void probe_k16(int kind, int tests, std::mt19937_64& gen, const std::string& path) {
  const bool bf16 = kind == 1, acc16 = kind == 2;
  std::vector<Member> members;
  for (const char* set : {"exact", "zero", "random", "subnormal"}) {
    if (bf16 && std::strcmp(set, "subnormal") == 0) continue;
    std::vector<std::uint16_t> a(tests * 256), bt(tests * 128), c16(tests * 128);
    std::vector<float> c(tests * 128);
    const std::string s = set;
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (s == "exact") a[i] = half_bits(static_cast<float>(static_cast<int>(gen() % 9) - 4), bf16);
      else if (s == "zero") a[i] = 0;
      else if (s == "random") a[i] = random_half(gen, -8, acc16 ? 4 : 6, bf16);
      else a[i] = gen() & 1 ? static_cast<std::uint16_t>((gen() & 0x83ff) | 1) : random_half(gen, -14, -8, false);
    }
    for (std::size_t i = 0; i < bt.size(); ++i) {
      if (s == "exact") bt[i] = half_bits(static_cast<float>(static_cast<int>(gen() % 9) - 4), bf16);
      else if (s == "zero") bt[i] = 0;
      else if (s == "random") bt[i] = random_half(gen, -8, acc16 ? 4 : 6, bf16);
      else bt[i] = random_half(gen, -2, 8, false);
    }
    for (std::size_t i = 0; i < c.size(); ++i) {
      float v;
      if (s == "exact") v = static_cast<float>(static_cast<int>(gen() % 201) - 100);
      else if (s == "zero" && !acc16) {
        const std::uint32_t u = static_cast<std::uint32_t>(gen());
        std::memcpy(&v, &u, 4);
      } else if (s == "zero") v = half_value(random_half(gen, -14, 15, false), false);
      else if (s == "subnormal") v = gen() % 2 ? 0.0f : std::ldexp(static_cast<float>(gen() % 1024), -20);
      else v = acc16 ? half_value(random_half(gen, -8, 6, false), false) : random_c(gen);
      c[i] = v;
      c16[i] = acc16 ? half_bits(v, false) : 0;
    }
    std::uint16_t *da = to_device(a), *db = to_device(bt), *dc16 = to_device(c16), *dd16 = nullptr;
    float *dc = to_device(c), *dd = nullptr;
    check(cudaMalloc(&dd, c.size() * 4), "cudaMalloc");
    check(cudaMalloc(&dd16, c.size() * 2), "cudaMalloc");
    if (kind == 0) mma_k16<0><<<tests, 32>>>(da, db, dc16, dd16, dc, dd);
    if (kind == 1) mma_k16<1><<<tests, 32>>>(da, db, dc16, dd16, dc, dd);
    if (kind == 2) mma_k16<2><<<tests, 32>>>(da, db, dc16, dd16, dc, dd);
    check(cudaGetLastError(), "mma.sync m16n8k16 launch");
    check(cudaDeviceSynchronize(), "mma.sync m16n8k16");
    const std::vector<float> d = from_device(dd, c.size());
    const std::vector<std::uint16_t> d16 = from_device(dd16, c.size());
    if (s == "exact") {  // the fragment layout: every output is the exact sum
      for (int t = 0; t < tests; ++t)
        for (int i = 0; i < 16; ++i)
          for (int j = 0; j < 8; ++j) {
            double sum = c[t * 128 + i * 8 + j];
            for (int k = 0; k < 16; ++k) sum += half_value(a[t * 256 + i * 16 + k], bf16) * half_value(bt[t * 128 + j * 16 + k], bf16);
            const double got = acc16 ? half_value(d16[t * 128 + i * 8 + j], false) : d[t * 128 + i * 8 + j];
            if (got != sum) {
              std::fprintf(stderr, "mma-probe: %s exact set: test %d D[%d][%d] = %g, exact %g: fragment layout wrong\n",
                           path.c_str(), t, i, j, got, sum);
              std::exit(1);
            }
          }
    }
    members.push_back(member(s + "_A", "U16", {tests, 16, 16}, a));
    members.push_back(member(s + "_Bt", "U16", {tests, 8, 16}, bt));
    if (acc16) {
      members.push_back(member(s + "_C", "F16", {tests, 16, 8}, c16));
      members.push_back(member(s + "_D", "F16", {tests, 16, 8}, d16));
    } else {
      members.push_back(member(s + "_C", "F32", {tests, 16, 8}, c));
      members.push_back(member(s + "_D", "F32", {tests, 16, 8}, d));
    }
    cudaFree(da), cudaFree(db), cudaFree(dc16), cudaFree(dd16), cudaFree(dc), cudaFree(dd);
  }
  write_safetensors(path, members);
}

void probe_k32_e4m3(int tests, std::mt19937_64& gen, const std::string& path) {
  std::vector<Member> members;
  for (const char* set : {"exact", "zero", "random"}) {
    const std::string s = set;
    std::vector<std::uint8_t> a(tests * 512), bt(tests * 256);
    std::vector<float> c(tests * 128);
    auto code = [&]() -> std::uint8_t {
      if (s == "exact") return e4m3_code(static_cast<int>(gen() % 9) - 4);
      if (s == "zero") return 0;
      std::uint8_t v;
      do v = static_cast<std::uint8_t>(gen()); while ((v & 0x7f) == 0x7f);
      return v;
    };
    for (auto& x : a) x = code();
    for (auto& x : bt) x = code();
    for (auto& x : c) {
      if (s == "exact") x = static_cast<float>(static_cast<int>(gen() % 201) - 100);
      else if (s == "zero") {
        const std::uint32_t u = static_cast<std::uint32_t>(gen());
        std::memcpy(&x, &u, 4);
      } else x = random_c(gen);
    }
    std::uint8_t *da = to_device(a), *db = to_device(bt);
    float *dc = to_device(c), *dd = nullptr;
    check(cudaMalloc(&dd, c.size() * 4), "cudaMalloc");
    mma_k32_e4m3<<<tests, 32>>>(da, db, dc, dd);
    check(cudaGetLastError(), "mma.sync m16n8k32 launch");
    check(cudaDeviceSynchronize(), "mma.sync m16n8k32");
    const std::vector<float> d = from_device(dd, c.size());
    if (s == "exact")
      for (int t = 0; t < tests; ++t)
        for (int i = 0; i < 16; ++i)
          for (int j = 0; j < 8; ++j) {
            double sum = c[t * 128 + i * 8 + j];
            for (int k = 0; k < 32; ++k) sum += e4m3_value(a[t * 512 + i * 32 + k]) * e4m3_value(bt[t * 256 + j * 32 + k]);
            if (d[t * 128 + i * 8 + j] != sum) {
              std::fprintf(stderr, "mma-probe: e4m3 exact set: test %d D[%d][%d] = %g, exact %g: fragment layout wrong\n",
                           t, i, j, d[t * 128 + i * 8 + j], sum);
              std::exit(1);
            }
          }
    members.push_back(member(s + "_A", "U8", {tests, 16, 32}, a));
    members.push_back(member(s + "_Bt", "U8", {tests, 8, 32}, bt));
    members.push_back(member(s + "_C", "F32", {tests, 16, 8}, c));
    members.push_back(member(s + "_D", "F32", {tests, 16, 8}, d));
    cudaFree(da), cudaFree(db), cudaFree(dc), cudaFree(dd);
  }
  write_safetensors(path, members);
}

#if PROBE_HAVE_CUBLASLT
bool lt_ok(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) std::fprintf(stderr, "mma-probe: cuBLASLt %s: status %d\n", what, static_cast<int>(s));
  return s == CUBLAS_STATUS_SUCCESS;
}

// D (M x N, row-major) = A (M x K, row-major) · B, B given as Bt (N x K, row-major), E4M3, float32 out, beta = 0.
// cuBLASLt is column-major and FP8 wants A transposed, so it computes D^T (N x M, column-major = D row-major) as
// op(Bt memory viewed K x N) = T times (A memory viewed K x M) = N.
bool cublaslt_fp8(cublasLtHandle_t h, const std::uint8_t* a, const std::uint8_t* bt, float* d, int m, int n, int k,
                  bool fast, void* workspace, std::size_t workspace_bytes) {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  bool ok = lt_ok(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  const std::int8_t fast_accum = fast ? 1 : 0;
  ok = ok && lt_ok(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "TRANSA");
  ok = ok && lt_ok(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "TRANSB");
  ok = ok && lt_ok(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum, sizeof fast_accum),
                   "FAST_ACCUM");
  ok = ok && lt_ok(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, k, n, k), "layout A");
  ok = ok && lt_ok(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, k, m, k), "layout B");
  ok = ok && lt_ok(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, n, m, n), "layout C/D");
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  ok = ok && lt_ok(cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate");
  ok = ok && lt_ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                                        sizeof workspace_bytes),
                   "workspace");
  ok = ok && lt_ok(cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, lc, lc, pref, 1, &result, &found), "heuristic");
  if (ok && found == 0) {
    std::fprintf(stderr, "mma-probe: cuBLASLt found no FP8 algorithm for %d x %d x %d\n", m, n, k);
    ok = false;
  }
  const float alpha = 1.0f, beta = 0.0f;
  ok = ok && lt_ok(cublasLtMatmul(h, op, &alpha, bt, la, a, lb, &beta, d, lc, d, lc, &result.algo, workspace,
                                  workspace_bytes, 0),
                   "Matmul");
  ok = ok && cudaDeviceSynchronize() == cudaSuccess;
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (lc) cublasLtMatrixLayoutDestroy(lc);
  if (lb) cublasLtMatrixLayoutDestroy(lb);
  if (la) cublasLtMatrixLayoutDestroy(la);
  if (op) cublasLtMatmulDescDestroy(op);
  return ok;
}

void probe_cublaslt(std::mt19937_64& gen, const std::string& path) {
  cublasLtHandle_t h;
  if (!lt_ok(cublasLtCreate(&h), "Create")) return;
  const std::size_t workspace_bytes = 32 << 20;
  void* workspace = nullptr;
  check(cudaMalloc(&workspace, workspace_bytes), "cudaMalloc");
  std::vector<Member> members;
  const int m = 64, n = 64;
  for (int k : {32, 64, 128, 256, 1024, 4096}) {
    std::vector<std::uint8_t> a(m * k), bt(n * k);
    for (auto* v : {&a, &bt})
      for (auto& x : *v) do x = static_cast<std::uint8_t>(gen()); while ((x & 0x7f) == 0x7f);
    std::uint8_t *da = to_device(a), *db = to_device(bt);
    float* dd = nullptr;
    check(cudaMalloc(&dd, m * n * 4), "cudaMalloc");
    const std::string s = "K" + std::to_string(k) + "_bytes";
    members.push_back(member(s + "_A", "U8", {m, k}, a));
    members.push_back(member(s + "_Bt", "U8", {n, k}, bt));
    for (bool fast : {true, false}) {
      if (!cublaslt_fp8(h, da, db, dd, m, n, k, fast, workspace, workspace_bytes)) {
        std::fprintf(stderr, "mma-probe: no cuBLASLt FP8 GEMM on this GPU: %s not written\n", path.c_str());
        return;
      }
      members.push_back(member(s + (fast ? "_fast_D" : "_default_D"), "F32", {m, n}, from_device(dd, m * n)));
    }
    cudaFree(da), cudaFree(db), cudaFree(dd);
  }
  cudaFree(workspace);
  cublasLtDestroy(h);
  write_safetensors(path, members);
}
#endif

// The patterns at which cvt.rn.satfinite's code changes, in the text layout of ../shared/data/h100-fp8.
void probe_cvt(const std::string& path) {
  std::ofstream out(path);
  out << "# cvt.rn.satfinite.<fmt>x2.f32: input fp32 bit pattern u at which the output code changes (code(u) != "
         "code(u-1)), and code(u)\n";
  const std::uint32_t chunk = 1u << 28;
  std::uint8_t* dev = nullptr;
  check(cudaMalloc(&dev, chunk), "cudaMalloc");
  std::vector<std::uint8_t> host(chunk);
  for (int e5m2 = 0; e5m2 < 2; ++e5m2)
    for (int half = 0; half < 2; ++half) {
      std::vector<std::pair<std::uint32_t, int>> changes;
      int prev = -1;
      for (std::uint64_t base = half ? 0x80000000ull : 0; base < (half ? 0x100000000ull : 0x80000000ull); base += chunk) {
        cvt_all<<<chunk / 256, 256>>>(static_cast<std::uint32_t>(base), chunk, e5m2, dev);
        check(cudaGetLastError(), "cvt launch");
        check(cudaMemcpy(host.data(), dev, chunk, cudaMemcpyDeviceToHost), "cvt copy");
        for (std::uint32_t i = 0; i < chunk; ++i)
          if (host[i] != prev) changes.emplace_back(static_cast<std::uint32_t>(base + i), prev = host[i]);
      }
      const char* fmt = e5m2 ? "e5m2" : "e4m3";
      out << "## " << fmt << (half ? " negative" : " positive") << " half: " << changes.size() << " transitions\n";
      char line[64];
      for (const auto& [u, code] : changes) {
        std::snprintf(line, sizeof line, "%s %08x %02x\n", fmt, u, code);
        out << line;
      }
    }
  cudaFree(dev);
  std::printf("wrote %s\n", path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') {
    std::fprintf(stderr, "usage: mma-probe OUT_DIR [--tests N] [--seed S]\n");
    return 2;
  }
  const std::string dir = argv[1];
  int tests = 256;
  unsigned long long seed = 20261126;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--tests") == 0) tests = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--seed") == 0) seed = std::strtoull(argv[i + 1], nullptr, 10);
    else {
      std::fprintf(stderr, "mma-probe: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (tests < 1 || tests > 65536) {
    std::fprintf(stderr, "mma-probe: --tests must be 1 ... 65536\n");
    return 2;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  const int cc = prop.major * 10 + prop.minor;
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  std::printf("mma-probe: %s, compute capability %d.%d, driver API %d, runtime %d, seed %llu, %d tests per set\n",
              prop.name, prop.major, prop.minor, driver, runtime, seed, tests);
  std::mt19937_64 gen(seed);
  if (cc < 80) {
    std::fprintf(stderr, "mma-probe: compute capability %d.%d has no m16n8k16 mma.sync\n", prop.major, prop.minor);
    return 1;
  }
  probe_k16(0, tests, gen, dir + "/mma_sync_m16n8k16_f16f32.safetensors");
  probe_k16(1, tests, gen, dir + "/mma_sync_m16n8k16_bf16f32.safetensors");
  probe_k16(2, tests, gen, dir + "/mma_sync_m16n8k16_f16f16.safetensors");
  if (cc >= 89) {
    probe_k32_e4m3(tests, gen, dir + "/mma_sync_m16n8k32_e4m3.safetensors");
#if PROBE_HAVE_CUBLASLT
    probe_cublaslt(gen, dir + "/wgmma_cublaslt_e4m3.safetensors");
#endif
    probe_cvt(dir + "/cvt_satfinite_transitions.txt");
  } else {
    std::printf("mma-probe: compute capability %d.%d has no FP8: FP8 files not written\n", prop.major, prop.minor);
  }
  return 0;
}
