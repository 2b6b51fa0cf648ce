// qattn: one program, one subcommand per task. Run `qattn --help` or `qattn SUBCOMMAND --help`.
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include <algorithm>
#include <exception>
#include <iostream>
#include <limits>
#include <set>
#if defined(__GLIBC__)
#include <malloc.h>
#include <sys/mman.h>
#endif

#include "commands.h"
#include "engine_setting.h"
#include "shard.h"
#include "qattn/error.h"
#include "qattn/parallel.h"

namespace {

// The edit distance of a and b (insertions, deletions, substitutions, adjacent transpositions), for "did you mean".
std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i)
    for (std::size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

// A first argument that is neither an option nor a command: its name, the closest command when one is near, and every
// command, instead of CLI11's "A subcommand is required".
bool unknown_command(const CLI::App& app, int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return false;
  const std::string given = argv[1];
  std::string names, closest;
  std::size_t best = 3;  // suggest only within two edits
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    const std::string& name = sub->get_name();
    if (name == given) return false;
    names += (names.empty() ? "" : ", ") + name;
    if (const std::size_t dist = edit_distance(given, name); dist < best) best = dist, closest = name;
  }
  std::cerr << "qattn: unknown command '" << given << "'"
            << (closest.empty() ? std::string() : " (did you mean '" + closest + "'?)") << "; the commands are: " << names
            << "\n";
  return true;
}

// A command allocates a few large buffers (tensors of several MB), frees some, and allocates others of the same size.
// glibc serves such sizes with mmap and gives them back with munmap, raising its threshold only as it goes, so each
// new buffer starts on fresh pages, and first touches of fresh pages are the bulk of what reading and writing a
// tensor costs (on the VMs measured in docs/kernels.md, about 0.4 ms per MB, ten times a warm memset). Blocks up to
// 32 MiB (glibc's largest mmap threshold) come from the heap instead, and the heap is never trimmed before exit, so
// freed pages are reused. Peak memory is unchanged: only what is already held is kept. Larger blocks (P at large L)
// are still mapped and unmapped one by one.
void keep_freed_memory() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
#endif
}

#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__)
// Advises the whole 2 MiB pages of a fresh, untouched block of n bytes and frees it, all but its start. The 2 MiB page
// the block starts in holds older blocks (and in the main heap also begins below the heap), so it cannot become a
// huge page. Shrinking the block to end near its first whole 2 MiB page (in place: a shrink splits the chunk and
// gives the rest back to the top) keeps that page's remainder out of later blocks, which then start in advised,
// aligned pages; the kept piece is address space only, never touched.
void advise_and_release(void* block, std::size_t n) {
  constexpr std::uintptr_t kHugePage = std::uintptr_t{2} << 20;
  const auto at = reinterpret_cast<std::uintptr_t>(block);
  const std::uintptr_t begin = (at + kHugePage - 1) & ~(kHugePage - 1);
  const std::uintptr_t end = (at + n) & ~(kHugePage - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);  // failure: plain pages
  const std::size_t below = begin - at;
  if (below >= 64 && std::realloc(block, below) == block) return;
  std::free(block);
}

// The same for a helper thread of the kernels' pool (qattn/parallel.h), which allocates from a malloc arena of its
// own: 24 MiB of it, under the 32 MiB mmap threshold, so that the thread's later buffers (a fused call's S and P
// blocks, 2.6 MiB per worker at L_k = 16384) are carved from huge pages.
void back_arena_with_huge_pages() {
  constexpr std::size_t kReserve = std::size_t{24} << 20;
  if (void* block = std::malloc(kReserve)) advise_and_release(block, kReserve);
}
#endif

// Fresh pages still cost a fault each, and on some VMs a first touch costs 3-4 ms per MB with 4 KiB pages: most of what
// `qattn attention` adds to the fused kernels' time at L = 16384 (docs/kernels.md). A transparent huge page takes one
// fault per 2 MiB. Under the kernel's default THP mode, `madvise`, a region gets them only where the program asks, and
// glibc asks only when started with GLIBC_TUNABLES=glibc.malloc.hugetlb=1. So the program grows its heap once by 1 GiB
// of address space (a single block from brk: with mmap refused for the moment; only the block's two boundary pages are
// touched, so resident memory is unchanged), advises it MADV_HUGEPAGE and frees it (all but its start,
// advise_and_release): the heap is never trimmed (above), and the main thread's blocks below the 32 MiB mmap threshold
// are carved from the advised range until 1 GiB is in use. Other threads allocate from malloc arenas of their own. Each
// helper thread of the kernels' pool does the same with 24 MiB of its arena as it starts
// (qattn::set_helper_thread_start), so a fused call's per-worker buffers get huge pages where they are; allocating them
// on this thread instead, or one arena for all (M_ARENA_MAX = 1), made the fused kernels 12-20 % slower at 2 threads
// (docs/kernels.md: the cause is not known). The reader advises its own buffers (read_file_bytes), so K and V read on
// their own threads get huge pages too. Off with QATTN_HUGE_PAGES=0; skipped under AddressSanitizer, whose allocator
// owns the heap. Where THP is disabled the advice does nothing.
void back_heap_with_huge_pages() {
#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__)
  if (const char* v = std::getenv("QATTN_HUGE_PAGES"); v != nullptr && std::strcmp(v, "0") == 0) return;
  constexpr std::size_t kReserve = std::size_t{1} << 30;
  constexpr int kDefaultMmapMax = 65536;  // glibc's DEFAULT_MMAP_MAX
  mallopt(M_MMAP_MAX, 0);
  void* block = std::malloc(kReserve);
  mallopt(M_MMAP_MAX, kDefaultMmapMax);
  if (block == nullptr) return;  // no room for the reservation: plain pages
  advise_and_release(block, kReserve);
  qattn::set_helper_thread_start(back_arena_with_huge_pages);
#endif
}

}  // namespace

int main(int argc, char** argv) {
  using namespace qattn::cli;
  keep_freed_memory();
  back_heap_with_huge_pages();
  // An old preset spelling (sage2@8b) says on stderr, once, which preset it now means.
  qattn::set_preset_alias_notice([](const std::string& text) {
    static std::set<std::string> said;
    if (said.insert(text).second) std::cerr << "qattn: note: " << text << "\n";
  });
  CLI::App app{"qattn: quantized softmax and attention, measured against exact references"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Help for every subcommand");
  app.set_version_flag("--version", "qattn " QATTN_VERSION);
  add_info(app);
  add_methods(app);
  add_softmax(app);
  add_attention(app);
  add_compare(app);
  add_analyze(app);
  add_bench(app);
  add_bench_eval(app);
  add_sweep(app);
  add_reproduce(app);
  add_plot(app);
  add_merge(app);
  add_mma(app);
  add_mma_check(app);
  add_kernel(app);
  require_decimal_counts(app);  // every command's --threads and --block-rows: "" and 2^70 are refused, not 0 and 2^63 - 1
  if (unknown_command(app, argc, argv)) return kExitUsage;
  try {
    check_isa_environment();  // QATTN_ISA holds for every command: a bad value is exit 2 before any work
    app.parse(argc, argv);
  } catch (const ExitCode& e) {
    return e.code;
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kExitUsage;
  } catch (const qattn::SpecError& e) {
    std::cerr << "qattn: " << e.what() << "\n";
    return kExitUsage;
  } catch (const qattn::InputError& e) {
    std::cerr << "qattn: error: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const std::exception& e) {
    std::cerr << "qattn: error: " << e.what() << "\n";
    return kExitBadInput;
  }
  // Output to stdout that did not arrive (a full disk, > /dev/full, a closed descriptor) is a failure, not success.
  if (const int err = flush_stdout()) {
    std::cerr << "qattn: error: standard output: write failed: " << std::strerror(err) << "\n";
    return kExitBadInput;
  }
  return kExitOk;
}
