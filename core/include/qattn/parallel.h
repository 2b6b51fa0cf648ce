// The one thread pool of the library and the CLI.
//
// parallel_for_workers(n, threads, body) runs body(i, worker) for every i in [0, n) on min(threads, n) workers: the
// calling thread is worker 0, the others are threads kept parked between calls (a nested or concurrent call starts
// and joins its own), and all are done before it returns, so `worker` indexes per-worker scratch. Items are handed out in increasing order from a shared counter (a slow item does not hold back
// the rest). Once a body throws, no further item starts; when every worker has stopped, the first exception is
// rethrown in the caller. threads <= 0 means one worker per hardware thread. Which worker runs an item is not
// deterministic, so results must not depend on it: every caller writes item i's output to its own place.
#pragma once

#include <cstddef>
#include <functional>

namespace qattn {

// The bound of every thread option: the CLI's --threads and Python's threads= take [0, kMaxThreads].
inline constexpr int kMaxThreads = 1024;
// "0 = every core", resolved here and nowhere else: threads > 0 is kept, threads <= 0 gives one worker per hardware
// thread (at least 1).
int resolve_threads(int threads);

void parallel_for_workers(std::size_t n, int threads, const std::function<void(std::size_t i, int worker)>& body);
inline void parallel_for(std::size_t n, int threads, const std::function<void(std::size_t i)>& body) {
  parallel_for_workers(n, threads, [&](std::size_t i, int) { body(i); });
}
// The number of workers parallel_for_workers uses for n items: min(resolve_threads(threads), n), at least 1.
int parallel_workers(std::size_t n, int threads);
// A function every thread that parallel_for_workers starts runs once as it starts, before its first item, or nullptr
// for none (the default): the kept helper threads and a nested or concurrent call's own. A program sets it before
// its first parallel call, to prepare what is per thread (the CLI: the thread's malloc arena, cli/main.cc);
// helper threads already started do not run it. It must not throw.
void set_helper_thread_start(void (*start)());

}  // namespace qattn
