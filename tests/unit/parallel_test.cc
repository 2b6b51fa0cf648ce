// parallel_for (qattn/parallel.h): every item exactly once on any thread count, worker ids below the worker count,
// the first exception rethrown in the caller and no item started after it.
#include <catch2/catch.hpp>
#include <atomic>
#include <stdexcept>
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
