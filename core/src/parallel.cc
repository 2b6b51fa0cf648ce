#include "qattn/parallel.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace qattn {
namespace {

// Helper threads kept between calls (worker ids 1, 2, ...), parked on a condition variable: starting and joining
// threads cost 30-75 us a call here, a few per cent of a fused attention at L = 2048. One call uses the pool at a
// time; a nested call (a body that calls parallel_for) or a concurrent one from another thread starts and joins its
// own threads instead. The threads are detached and the pool is never destroyed (threads parked at exit are fine);
// a forked child, which has none of the parent's threads, gets a fresh pool (pthread_atfork).
std::atomic<void (*)()> helper_start{nullptr};

class Pool {
 public:
  // Runs job(w) for w in [0, helpers]: w = 0 on the calling thread, the rest on pool threads; returns when all have.
  void run(int helpers, const std::function<void(int)>& job) {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      while (started_ < helpers) {
        ++started_;
        std::thread(&Pool::helper, this, started_).detach();
      }
      job_ = &job;
      helpers_ = helpers;
      remaining_ = helpers;
      generation_.fetch_add(1);
    }
    wake_.notify_all();
    job(0);
    spin_until([&] { return remaining_.load() == 0; });
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return remaining_.load() == 0; });
    job_ = nullptr;
  }

  std::atomic<bool> busy{false};

 private:
  // Waking a parked thread takes tens of microseconds on a VM, so both sides poll for a while first (as OpenMP
  // runtimes do) before they block: back-to-back calls, the common case in a loop over heads, never park.
  template <typename Ready>
  static void spin_until(Ready ready) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(200);
    for (int i = 0; !ready(); ++i) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#elif defined(__aarch64__)
      asm volatile("yield");
#endif
      if (i % 64 == 63 && std::chrono::steady_clock::now() > until) return;
    }
  }

  void helper(int id) {
    if (void (*start)() = helper_start.load()) start();
    std::uint64_t seen = 0;
    for (;;) {
      spin_until([&] { return generation_.load() != seen; });
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return generation_.load() != seen; });
      seen = generation_.load();
      if (id > helpers_) continue;  // not asked this time
      const std::function<void(int)>* job = job_;
      lock.unlock();
      (*job)(id);  // never throws: parallel_for_workers catches inside
      if (remaining_.fetch_sub(1) == 1) {
        const std::lock_guard<std::mutex> relock(mutex_);  // the caller is either polling or parked on done_
        done_.notify_one();
      }
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_, done_;
  int started_ = 0, helpers_ = 0;
  std::atomic<int> remaining_{0};
  std::atomic<std::uint64_t> generation_{0};
  const std::function<void(int)>* job_ = nullptr;
};

std::atomic<Pool*> the_pool{nullptr};

Pool& pool() {
  static std::once_flag once;
  std::call_once(once, [] {
    the_pool.store(new Pool);
    pthread_atfork(nullptr, nullptr, [] { the_pool.store(new Pool); });  // the parent's pool is left as it was
  });
  return *the_pool.load();
}

}  // namespace

void set_helper_thread_start(void (*start)()) { helper_start.store(start); }

int resolve_threads(int threads) {
  return threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

int parallel_workers(std::size_t n, int threads) {
  const auto t = static_cast<std::size_t>(resolve_threads(threads));
  return static_cast<int>(std::max<std::size_t>(1, std::min(t, n)));
}

void parallel_for_workers(std::size_t n, int threads, const std::function<void(std::size_t, int)>& body) {
  if (n == 0) return;
  const int workers = parallel_workers(n, threads);
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  const std::function<void(int)> run = [&](int worker) {
    for (std::size_t i = next++; i < n && !failed; i = next++) {
      try {
        body(i, worker);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        failed = true;
      }
    }
  };
  if (workers == 1) {
    run(0);
  } else if (Pool& p = pool(); !p.busy.exchange(true)) {
    p.run(workers - 1, run);
    p.busy = false;
  } else {
    std::vector<std::thread> own;
    own.reserve(static_cast<std::size_t>(workers - 1));
    for (int w = 1; w < workers; ++w)
      own.emplace_back([&run, w] {
        if (void (*start)() = helper_start.load()) start();
        run(w);
      });
    run(0);
    for (std::thread& t : own) t.join();
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace qattn
