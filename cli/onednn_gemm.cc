#include "onednn_gemm.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <new>
#include <vector>

#if defined(QATTN_HAVE_DNNL)
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace qattn::cli {

#if defined(QATTN_HAVE_DNNL)

bool onednn_built() { return true; }

std::string onednn_version() {
  const dnnl_version_t* v = dnnl_version();
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) +
         " (OpenMP)";
}

namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using Type = memory::data_type;

// One matmul primitive (oneDNN 2.x API: desc, then primitive_desc), run over caller-owned buffers.
double median_matmul_ms(const void* a, Type ta, memory::dims da, Tag fa, const void* b, memory::dims db, Tag fb,
                        std::int32_t* c, memory::dims dc, int reps) {
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const memory::desc ma(da, ta, fa), mb(db, Type::s8, fb), mc(dc, Type::s32, Tag::ab);
  const dnnl::matmul::desc desc(ma, mb, mc);
  const dnnl::matmul::primitive_desc pd(desc, engine);
  const dnnl::matmul matmul(pd);
  memory A(ma, engine, const_cast<void*>(a)), B(mb, engine, const_cast<void*>(b)), C(mc, engine, c);
  auto run = [&] {
    matmul.execute(stream, {{DNNL_ARG_SRC, A}, {DNNL_ARG_WEIGHTS, B}, {DNNL_ARG_DST, C}});
    stream.wait();
  };
  run();  // warm-up: first-touch pages, oneDNN's kernel generation
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// A 64-byte aligned copy or buffer: oneDNN reads and writes the caller's memory as it is, and rows that start mid-line
// cost its AMX tiles two cache lines each (the default allocator aligns to 16 bytes). The fused kernels' buffers are
// aligned the same way (kernels/src/pipeline.cc), so both sides of the comparison get whole lines.
template <typename T>
struct Aligned {
  explicit Aligned(std::size_t n)
      : p(static_cast<T*>(std::aligned_alloc(64, std::max<std::size_t>((n * sizeof(T) + 63) / 64 * 64, 64)))) {
    if (!p) throw std::bad_alloc();
  }
  Aligned(const T* src, std::size_t n) : Aligned(n) { std::copy_n(src, n, p); }
  Aligned(const Aligned&) = delete;
  Aligned& operator=(const Aligned&) = delete;
  ~Aligned() { std::free(p); }
  T* p;
};

}  // namespace

OneDnnTimes time_onednn_gemms(const std::int8_t* q, const std::int8_t* k, const std::int8_t* v, int L, int d,
                              int threads, int reps) {
  omp_set_num_threads(threads);
  OneDnnTimes out;
  const memory::dim l = L, dd = d;
  const std::size_t ld = static_cast<std::size_t>(l) * dd, ll = static_cast<std::size_t>(l) * l;
  const Aligned<std::int8_t> qa(q, ld), ka(k, ld), va(v, ld);
  {
    Aligned<std::int32_t> s(ll);
    std::fill_n(s.p, ll, 0);
    // K^T as a [d, L] matrix whose rows are strided: tag ba, i.e. K itself row-major.
    out.qk_ms = median_matmul_ms(qa.p, Type::s8, {l, dd}, Tag::ab, ka.p, {dd, l}, Tag::ba, s.p, {l, l}, reps);
  }
  {
    Aligned<std::uint8_t> p(ll);
    for (std::size_t i = 0; i < ll; ++i) p.p[i] = static_cast<std::uint8_t>((i * 2654435761u) >> 24);
    Aligned<std::int32_t> o(ld);
    std::fill_n(o.p, ld, 0);
    out.pv_ms = median_matmul_ms(p.p, Type::u8, {l, l}, Tag::ab, va.p, {l, dd}, Tag::ab, o.p, {l, dd}, reps);
  }
  return out;
}

#else

bool onednn_built() { return false; }
std::string onednn_version() { return "oneDNN not built in (install libdnnl-dev and reconfigure)"; }
OneDnnTimes time_onednn_gemms(const std::int8_t*, const std::int8_t*, const std::int8_t*, int, int, int, int) {
  return {};
}

#endif

}  // namespace qattn::cli
