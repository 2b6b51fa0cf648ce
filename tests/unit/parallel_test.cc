// parallel_for (qattn/parallel.h): every item exactly once on any thread count, worker ids below the worker count and
// never in use twice at once, the first exception rethrown in the caller and no item started after it; nested,
// concurrent and post-fork calls; the start function of the threads it starts.
#include <catch2/catch.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "qattn/parallel.h"

using namespace qattn;

TEST_CASE("parallel_for runs every item once, on any thread count", "[parallel]") {
  for (const int threads : {0, 1, 2, 3, 16})
    for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{7}, std::size_t{100}}) {
      INFO("threads " << threads << " n " << n);
      std::vector<std::atomic<int>> hits(n);
      std::atomic<int> bad_worker{0};
      const int workers = parallel_workers(n, threads);
      parallel_for_workers(n, threads, [&](std::size_t i, int worker) {
        ++hits[i];
        if (worker < 0 || worker >= workers) ++bad_worker;
      });
      for (std::size_t i = 0; i < n; ++i) CHECK(hits[i] == 1);
      CHECK(bad_worker == 0);
      CHECK(workers >= 1);
      if (threads > 0 && n > 0) CHECK(workers == static_cast<int>(std::min<std::size_t>(threads, n)));
    }
}

TEST_CASE("parallel_for rethrows the first exception and starts nothing after it", "[parallel]") {
  for (const int threads : {1, 2, 4}) {
    INFO("threads " << threads);
    std::atomic<int> started{0};
    CHECK_THROWS_WITH(parallel_for(1000, threads,
                                   [&](std::size_t i) {
                                     ++started;
                                     if (i == 3) throw std::runtime_error("item 3");
                                   }),
                      "item 3");
    // On one worker the order is fixed: items 0-3 ran, nothing after. With more, items handed out before the throw
    // may still run (how many depends on scheduling).
    if (threads == 1) CHECK(started == 4);
  }
}

TEST_CASE("parallel_for: a worker id is never in use twice at once, over many calls of changing width", "[parallel]") {
  // The per-worker scratch contract, across calls that reuse the pool's threads with 2, 3 and 5 workers.
  std::atomic<int> clashes{0}, items{0};
  for (int call = 0; call < 60; ++call) {
    const int threads = 2 + call % 4;
    std::vector<std::atomic<bool>> in_use(static_cast<std::size_t>(threads));
    parallel_for_workers(12, threads, [&](std::size_t, int worker) {
      if (in_use[static_cast<std::size_t>(worker)].exchange(true)) ++clashes;
      if (worker % 2) std::this_thread::sleep_for(std::chrono::microseconds(50));
      in_use[static_cast<std::size_t>(worker)] = false;
      ++items;
    });
  }
  CHECK(clashes == 0);
  CHECK(items == 60 * 12);
}

TEST_CASE("parallel_for: nested and concurrent calls each run every item once", "[parallel]") {
  std::vector<std::atomic<int>> hits(8 * 16);
  parallel_for(8, 2, [&](std::size_t i) {  // a body that calls parallel_for: it gets threads of its own
    parallel_for(16, 2, [&](std::size_t j) { ++hits[i * 16 + j]; });
  });
  for (const auto& h : hits) CHECK(h == 1);
  std::vector<std::atomic<int>> a(500), b(500);
  std::thread other([&] {
    for (int r = 0; r < 20; ++r) parallel_for(25, 2, [&](std::size_t i) { ++b[static_cast<std::size_t>(r) * 25 + i]; });
  });
  for (int r = 0; r < 20; ++r) parallel_for(25, 2, [&](std::size_t i) { ++a[static_cast<std::size_t>(r) * 25 + i]; });
  other.join();
  for (std::size_t i = 0; i < 500; ++i) CHECK((a[i] == 1 && b[i] == 1));
}

TEST_CASE("parallel_for works in a forked child after the parent used its threads", "[parallel][fork]") {
  std::atomic<int> n{0};
  parallel_for(10, 2, [&](std::size_t) { ++n; });  // the parent's pool now has a helper thread
  REQUIRE(n == 10);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // the child has none of the parent's threads: a call must not wait for them
    std::atomic<int> m{0};
    parallel_for(10, 2, [&](std::size_t) { ++m; });
    _exit(m == 10 ? 0 : 3);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("every thread parallel_for starts runs the start function once, before its first item", "[parallel][fork]") {
  // In a forked child, whose pool has no threads yet: 2 kept helpers (3 workers), then a call whose 4 items each make
  // a nested call of 3 workers on threads of its own (the pool is busy): 2 + 4 x 2 starts.
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    static std::atomic<int> starts{0};
    static thread_local bool prepared = false;
    set_helper_thread_start([] {
      ++starts;
      prepared = true;
    });
    std::atomic<int> unprepared{0};
    for (int call = 0; call < 5; ++call)  // the calling thread slowed, so that the helpers take items from the first
      parallel_for_workers(40, 3, [&](std::size_t, int worker) {
        if (worker == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        unprepared += worker != 0 && !prepared;
      });
    parallel_for_workers(4, 2, [&](std::size_t, int) {
      parallel_for_workers(4, 3, [&](std::size_t, int worker) { unprepared += worker != 0 && !prepared; });
    });
    set_helper_thread_start(nullptr);
    _exit(unprepared == 0 && starts == 2 + 4 * 2 ? 0 : 3);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("resolve_threads: 0 or less is every core and a count is kept - parallel_workers caps it at the items",
          "[parallel]") {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  CHECK(resolve_threads(0) == cores);
  CHECK(resolve_threads(-3) == cores);
  CHECK(resolve_threads(1) == 1);
  CHECK(resolve_threads(kMaxThreads) == kMaxThreads);
  CHECK(parallel_workers(5, 0) == std::min(cores, 5));
  CHECK(parallel_workers(5, 64) == 5);
  CHECK(parallel_workers(0, 8) == 1);
}
