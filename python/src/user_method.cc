// A user's Python callable as a qattn::Method (user_method.h).
#include "user_method.h"

#include <pybind11/numpy.h>

#include <chrono>
#include <condition_variable>
#include <stdexcept>
#include <thread>
#include <utility>

#include "qattn/error.h"

namespace qattn::python {
namespace {

// A user's Python callable as a qattn::Method, for qattn.analyze and qattn.sweep (python/qattn/__init__.py, Method).
// kind "softmax": fn(logits) -> P, logits a float64 array [rows, L] (masked entries -inf), P of the same shape; inside
// attention it sits between float64 logits scale q k^T and float64 P V, as the registry's softmax models do.
// kind "attention": fn(q, k, v, scale, mask) -> O [L_q, d_v] or (O, P); mask None or a bool array [L_q, L_k] (True =
// the query sees the key). The evaluation calls it from its worker threads, each call under the GIL. Unless
// `thread_safe`, a call first takes calls.serial and only then the GIL, never the other way round (a thread holding
// the GIL never waits for the lock, so the two cannot deadlock): the callable runs one call at a time even where it
// releases the GIL (time.sleep, NumPy on large arrays). Whatever it raises, a BaseException included, is kept in
// calls.raised and becomes std::invalid_argument naming the method and the head of the call; a result of the wrong
// shape or with NaN is a std::invalid_argument naming the method (a ValueError naming the file, head and method).
class PythonMethod final : public Method {
 public:
  PythonMethod(std::string name, py::object fn, bool attention, bool thread_safe, CallableCalls& calls)
      : name_(std::move(name)), fn_(std::move(fn)), attention_(attention), thread_safe_(thread_safe), calls_(calls) {}
  ~PythonMethod() override {
    py::gil_scoped_acquire gil;
    fn_ = py::object();
  }

 protected:
  RowMatrixXd softmax_rows_impl(const MatrixView& logits) const override {
    if (attention_) throw SpecError(name_ + ": an attention callable has no softmax-only form");
    const std::unique_lock<std::mutex> turn = take_turn();
    py::gil_scoped_acquire gil;
    return matrix(invoke([&] { return fn_(to_numpy(logits)); }), logits.rows(), logits.cols(), "P");
  }

  // The heads of a layer's call one after another, each head's index kept for the message of what fn raises.
  std::vector<AttentionResult> attention_heads_impl(const std::vector<MatrixView>& q, const std::vector<MatrixView>& k,
                                                    const std::vector<MatrixView>& v, double scale,
                                                    const AttentionMask& mask) const override {
    std::vector<AttentionResult> out;
    for (std::size_t h = 0; h < q.size(); ++h) {
      const HeadOfCall head(h, q.size());
      out.push_back(attention_impl(q[h], k[h], v[h], scale, mask));
    }
    return out;
  }

  AttentionResult attention_impl(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                 const AttentionMask& mask) const override {
    AttentionResult r;
    if (!attention_) {
      RowMatrixXd s = (q * k.transpose()) * scale;
      mask.apply_to_logits(s);
      r.p = softmax_rows(s);
      r.o = r.p * v;
      return r;
    }
    const std::unique_lock<std::mutex> turn = take_turn();
    py::gil_scoped_acquire gil;
    py::object m = py::none();
    if (!mask.empty()) {
      const RowMatrixXb visible = mask.visible(q.rows(), k.rows());
      py::array_t<bool> b({visible.rows(), visible.cols()});
      std::copy(visible.data(), visible.data() + visible.size(), b.mutable_data());
      m = b;
    }
    const py::object out = invoke([&] { return fn_(to_numpy(q), to_numpy(k), to_numpy(v), scale, m); });
    py::object o = out, p = py::none();
    if (py::isinstance<py::tuple>(out) && py::len(out) == 2) o = out[py::int_(0)], p = out[py::int_(1)];
    r.o = matrix(o, q.rows(), v.cols(), "O");
    if (!p.is_none()) r.p = matrix(p, q.rows(), k.rows(), "P");
    return r;
  }

 private:
  // " (head h of the call's n)" while attention_heads_impl runs head h of n > 1 on this thread, else "".
  static inline thread_local std::string head_of_call;
  struct HeadOfCall {
    HeadOfCall(std::size_t h, std::size_t n) {
      if (n > 1) head_of_call = " (head " + std::to_string(h) + " of the call's " + std::to_string(n) + ")";
    }
    ~HeadOfCall() { head_of_call.clear(); }
  };

  // This call's turn: the serial lock unless the callable is thread-safe, taken before the GIL. AnalysisInterrupted
  // once a signal is seen, before and after the wait.
  std::unique_lock<std::mutex> take_turn() const {
    if (calls_.stop) throw AnalysisInterrupted();
    std::unique_lock<std::mutex> turn(calls_.serial, std::defer_lock);
    if (!thread_safe_) turn.lock();
    if (calls_.stop) throw AnalysisInterrupted();
    return turn;
  }

  static py::array_t<double> to_numpy(const MatrixView& x) {
    py::array_t<double> a({x.rows(), x.cols()});
    Eigen::Map<RowMatrixXd>(a.mutable_data(), x.rows(), x.cols()) = x;
    return a;
  }

  // fn() under the GIL. What it raises is kept, with the reason of the std::invalid_argument thrown in its place:
  // "<method> raised <type>: <message>" and the head of the call.
  template <class Fn>
  py::object invoke(Fn&& fn) const {
    try {
      return fn();
    } catch (py::error_already_set& e) {
      const std::string raised = name_ + " raised " + e.type().attr("__name__").cast<std::string>();
      std::string message;
      try {
        message = py::str(e.value());
      } catch (py::error_already_set&) {  // a __str__ that raises: the type alone
      }
      const std::string reason = raised + (message.empty() ? "" : ": " + message) + head_of_call;
      {
        const std::lock_guard<std::mutex> hold(calls_.raised_lock);
        calls_.raised.push_back({reason, raised + head_of_call, e});
      }
      throw std::invalid_argument(reason);
    }
  }

  // What fn returned, as a [rows, cols] float64 matrix (under the GIL).
  RowMatrixXd matrix(const py::object& out, Eigen::Index rows, Eigen::Index cols, const char* what) const {
    py::array_t<double, py::array::c_style | py::array::forcecast> a;
    try {
      a = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(out);
    } catch (py::error_already_set& e) {
      throw std::invalid_argument(name_ + ": its " + what + " is not a float array");
    }
    if (!a || a.ndim() != 2 || a.shape(0) != rows || a.shape(1) != cols)
      throw std::invalid_argument(name_ + ": its " + what + " must be a float array of shape (" + std::to_string(rows) +
                                  ", " + std::to_string(cols) + ")");
    const RowMatrixXd m = Eigen::Map<const RowMatrixXd>(a.data(), rows, cols);
    if (!m.allFinite()) throw std::invalid_argument(name_ + ": its " + what + " holds NaN or inf");
    return m;
  }

  std::string name_;
  py::object fn_;
  bool attention_, thread_safe_;
  CallableCalls& calls_;
};

}  // namespace

UserMethod user_method(const py::tuple& entry, CallableCalls& calls, bool softmax_only) {
  if (entry.size() != 4) throw std::invalid_argument("own methods: (label, callable, kind, thread_safe) tuples");
  const std::string label = entry[0].cast<std::string>(), kind = entry[2].cast<std::string>();
  if (kind != "softmax" && kind != "attention")
    throw std::invalid_argument(label + ": kind must be 'softmax' or 'attention', got '" + kind + "'");
  if (softmax_only && kind == "attention")
    throw std::invalid_argument(label + ": an attention callable has no softmax-only form");
  return {label, std::make_unique<PythonMethod>(label, entry[1].cast<py::object>(), kind == "attention",
                                                entry[3].cast<bool>(), calls)};
}

// Runs body() on a thread of its own while the calling thread, which must not hold the GIL, looks for signals every
// 100 ms: Python runs its signal handlers on the main thread only, under the GIL, so a body run on this thread would
// leave Ctrl-C pending until it ends. Once a handler raises (KeyboardInterrupt), `stop` is set, the body is waited
// for (its workers stop between blocks) and the handler's exception is returned. Otherwise the body's own exception
// is rethrown, or nothing is returned.
std::optional<py::error_already_set> run_checking_signals(const std::function<void()>& body, std::atomic<bool>& stop) {
  std::mutex m;
  std::condition_variable ended;
  bool finished = false;
  std::exception_ptr error;
  std::thread runner([&] {
    try {
      body();
    } catch (...) {
      error = std::current_exception();
    }
    const std::lock_guard<std::mutex> hold(m);
    finished = true;
    ended.notify_one();
  });
  std::optional<py::error_already_set> signal;
  std::unique_lock<std::mutex> lock(m);
  while (!ended.wait_for(lock, std::chrono::milliseconds(100), [&] { return finished; })) {
    if (signal) continue;
    lock.unlock();
    {
      py::gil_scoped_acquire gil;
      if (PyErr_CheckSignals() != 0) {
        signal.emplace();  // fetches the handler's exception
        stop = true;
      }
    }
    lock.lock();
  }
  lock.unlock();
  runner.join();
  if (!signal && error) std::rethrow_exception(error);
  return signal;
}

// Rethrows `failure`. Where it is what a user's callable raised (the evaluation's InputError or the
// std::invalid_argument around it), the callable's own exception is raised instead, with its type and traceback
// (pdb.pm() reaches the callable's frame), and a note with the evaluation's context: the file, layer and batch entry
// or head, the method, and the head of the call. Called with the GIL.
[[noreturn]] void rethrow_raised(const std::exception_ptr& failure, CallableCalls& calls, const char* caller) {
  const auto raise_own = [&](const std::string& reason, const std::string& where) {
    for (CallableRaised& r : calls.raised) {
      if (r.reason != reason) continue;
      if (py::hasattr(r.error.value(), "add_note"))  // Python 3.11 and newer
        r.error.value().attr("add_note")(std::string(caller) + ": " + where + r.summary);
      throw r.error;
    }
  };
  try {
    std::rethrow_exception(failure);
  } catch (const InputError& e) {
    raise_own(e.reason(), printable(e.source(), 1024) + ": " + printable(e.field(), 200) + ": ");
    throw;
  } catch (const SpecError&) {
    throw;
  } catch (const std::invalid_argument& e) {
    raise_own(e.what(), "");
    throw;
  }
}

}  // namespace qattn::python
