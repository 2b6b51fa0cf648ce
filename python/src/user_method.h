// A user's Python callable as a qattn::Method (qattn.Method in python/qattn/__init__.py), for qattn.attention,
// qattn.analyze and qattn.sweep: how its calls share a lock, stop on Ctrl-C, and have what they raise re-raised as
// itself. Part of the binding (_qattn); not installed.
#pragma once

#include <pybind11/pybind11.h>

#include <atomic>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "qattn/method.h"

namespace qattn::python {
namespace py = pybind11;

// Thrown inside an analysis once a signal's handler has raised (Ctrl-C): it stops the workers between blocks and the
// user's callables between calls. Python sees the handler's exception, never this.
struct AnalysisInterrupted : std::exception {
  const char* what() const noexcept override { return "analysis interrupted"; }
};

// What the calls of the user's callables share within one analysis: the lock under which the callables not declared
// thread-safe run, one call at a time across all of them; the flag that stops every call once a signal is seen; and
// what the callables raised, each Python exception beside the reason of the std::invalid_argument it became, so that
// analyze_report can re-raise the exception itself once the evaluation has named the file, layer and method.
struct CallableRaised {
  std::string reason;   // "<method> raised <type>: <message>" and the head of the call: the key
  std::string summary;  // the same without the message, which the exception shows itself
  py::error_already_set error;
};
struct CallableCalls {
  std::mutex serial;
  std::atomic<bool> stop{false};
  std::mutex raised_lock;
  std::vector<CallableRaised> raised;
};

// A user's method entry, (label, callable, kind, thread_safe) as qattn.Method._entry gives it, with kind "softmax" or
// "attention", as a Method whose calls share `calls` (which must outlive it). std::invalid_argument (ValueError)
// naming the label for a kind other than those two, or for an attention callable where `softmax_only`.
struct UserMethod {
  std::string label;
  std::unique_ptr<Method> method;
};
UserMethod user_method(const py::tuple& entry, CallableCalls& calls, bool softmax_only = false);

// Runs body() on a thread of its own while the calling thread, which must not hold the GIL, looks for signals every
// 100 ms: Python runs its signal handlers on the main thread only, under the GIL, so a body run on this thread would
// leave Ctrl-C pending until it ends. Once a handler raises (KeyboardInterrupt), `stop` is set, the body is waited
// for (its workers stop between blocks) and the handler's exception is returned. Otherwise the body's own exception
// is rethrown, or nothing is returned.
std::optional<py::error_already_set> run_checking_signals(const std::function<void()>& body, std::atomic<bool>& stop);

// Rethrows `failure`. Where it is what a user's callable raised (the evaluation's InputError or the
// std::invalid_argument around it), the callable's own exception is raised instead, with its type and traceback
// (pdb.pm() reaches the callable's frame), and a note with the evaluation's context: the file, layer and batch entry
// or head, the method, and the head of the call. Called with the GIL.
[[noreturn]] void rethrow_raised(const std::exception_ptr& failure, CallableCalls& calls,
                                 const char* caller = "qattn.analyze");

}  // namespace qattn::python
