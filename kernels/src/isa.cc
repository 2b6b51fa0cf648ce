// ISA names, availability (build and CPU) and the QATTN_ISA override.
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "qattn/int_attention.h"
#include "qattn/kernel_variants.h"

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1 << 13)
#endif
#endif
#if defined(QATTN_HAVE_X86_KERNELS)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace qattn {
namespace {

#if defined(QATTN_HAVE_X86_KERNELS)
// AVX-VNNI (VEX-encoded vpdpbusd): CPUID leaf 7 sub-leaf 1, EAX bit 4, which is what GCC's
// __builtin_cpu_supports("avxvnni") reads. Clang 14 (the fuzz build's compiler) does not know that feature string.
bool cpu_has_avxvnni() {
#if defined(__clang__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) != 0 && ((eax >> 4) & 1u) != 0;
#else
  return __builtin_cpu_supports("avxvnni");
#endif
}

// AMX-TILE and AMX-INT8 (CPUID leaf 7 sub-leaf 0, EDX bits 24 and 25), the OS's tile state in XCR0 (bits 17 and 18,
// XTILECFG and XTILEDATA, read by xgetbv where CPUID leaf 1 ECX bit 27 says OSXSAVE), and Linux's permission to use
// the tile data (arch_prctl(ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18)), asked once for the process: a
// thread that executes a tile instruction without it is killed with SIGILL.
bool amx_permitted() {
  static const bool permitted = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
    if (((edx >> 24) & 1u) == 0 || ((edx >> 25) & 1u) == 0) return false;
    if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0 || ((ecx >> 27) & 1u) == 0) return false;
    unsigned lo = 0, hi = 0;
    asm volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if (((lo >> 17) & 3u) != 3u) return false;
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return permitted;
}
#endif

}  // namespace

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2";
    case Isa::avxvnni: return "avxvnni";
    case Isa::avx512vnni: return "avx512vnni";
    case Isa::amx: return "amx";
    case Isa::neon_dotprod: return "neon-dotprod";
    case Isa::neon_i8mm: return "neon-i8mm";
  }
  return "?";
}

Isa parse_isa(std::string_view name) {
  if (name == "scalar") return Isa::scalar;
  if (name == "avx2") return Isa::avx2;
  if (name == "avxvnni") return Isa::avxvnni;
  if (name == "avx512" || name == "avx512vnni") return Isa::avx512vnni;
  if (name == "amx") return Isa::amx;
  if (name == "neon-dotprod") return Isa::neon_dotprod;
  if (name == "neon-i8mm") return Isa::neon_i8mm;
  throw std::invalid_argument("unknown ISA '" + std::string(name) +
                              "' (scalar, avx2, avxvnni, avx512, amx, neon-dotprod, neon-i8mm)");
}

bool isa_available(Isa isa) {
  switch (isa) {
    case Isa::scalar: return true;
#if defined(QATTN_HAVE_X86_KERNELS)
    case Isa::avx2: return __builtin_cpu_supports("avx2");
    case Isa::avxvnni: return __builtin_cpu_supports("avx2") && cpu_has_avxvnni();
    case Isa::avx512vnni:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vnni");
    case Isa::amx: return isa_available(Isa::avx512vnni) && amx_permitted();
#endif
#if defined(QATTN_HAVE_ARM_KERNELS)
    case Isa::neon_dotprod: return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
    case Isa::neon_i8mm: return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0 && (getauxval(AT_HWCAP2) & HWCAP2_I8MM) != 0;
#endif
    default: return false;
  }
}

std::vector<Isa> available_isas() {
  std::vector<Isa> out;
  for (const kernels::KernelVariant& v : kernels::kernel_variants())  // the table's order: scalar first, best last
    if (isa_available(v.isa)) out.push_back(v.isa);
  return out;
}

std::string available_isa_names() {
  std::string s;
  for (Isa a : available_isas()) s += (s.empty() ? "" : ", ") + std::string(isa_name(a));
  return s;
}

Isa default_isa() {
  if (const char* forced = std::getenv("QATTN_ISA"); forced && *forced) {
    Isa isa;
    try {
      isa = parse_isa(forced);
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error(std::string("QATTN_ISA: ") + e.what() + "; available here: " + available_isa_names());
    }
    if (!isa_available(isa))
      throw std::runtime_error("QATTN_ISA=" + std::string(forced) + ": this build or CPU cannot run it (available: " +
                               available_isa_names() + ")");
    return isa;
  }
  return available_isas().back();
}

std::int64_t int8_mac_peak_loop(Isa isa, std::int64_t iterations, std::int32_t* checksum) {
  if (!isa_available(isa)) throw std::invalid_argument("int8_mac_peak_loop: ISA " + std::string(isa_name(isa)) + " not available");
  return kernels::kernel_variant(isa).mac_loop(iterations, checksum);
}

}  // namespace qattn
