// The eager way in for UlyssesGroup's methods: `fast_ulysses._cuda.owned(...)`, `.owned_out(...)`
// and `.borrowed(...)` take exactly the arguments the methods pass to the ops and call the same
// op through the dispatcher, typed. A call that records a backward (x requires grad, grad mode
// on) goes through the op's Autograd kernel, which is C++ (autograd_kernels.cpp); every other
// call goes below autograd (the methods have applied the autograd rules by then). What they skip
// is torch.ops' Python-side work: matching the arguments against the schema and boxing them.
// That was most of a call's host time outside the transport: at P = 8 on an H100 shared by
// eight ranks, skipping it cut a method call's host time by about 10 us
// (benchmarks/results/h100-shared-p8-quick-wan-typed-entry.json).
//
// Still the dispatcher: the profiler records the op, dispatch modes (TorchDispatchMode, fake
// tensors' mode) and the Meta and CPU kernels all see it as they would through torch.ops. What
// these functions are not built for, they decline by returning NotImplemented, and the method
// then calls torch.ops as before: a tensor subclass or a torch-function mode (both are handled
// before the dispatcher, in torch.ops' Python argument parsing), or an argument of any other
// type than the method passes (torch.ops raises its own error for it).
//
// The owned and borrowed calls leave the caller's stream free (transport/call_work.h): a result
// with a transfer still in flight comes back as torch's AsyncCollectiveTensor, whose first use
// waits for it on the device. Nothing else asks that of the op (torch.ops, the backward, compile).
#include "ops/fast_entry.h"

#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include "ops/call_args.h"
#include "ops/op_handles.h"
#include "transport/call_work.h"

#include <optional>
#include <string>
#include <vector>

namespace fast_ulysses::ops {
namespace {

// How many arguments each function takes: x and the list's (the out= op's `out` after them).
constexpr Py_ssize_t kOwnedCount = 1 FU_OWNED_ARGS(FU_COUNT);
constexpr Py_ssize_t kBorrowedCount = 1 FU_BORROWED_ARGS(FU_COUNT);

using Splits = std::optional<at::IntArrayRef>;

// An attribute of torch.distributed._functional_collectives (a new reference; null with a Python
// error set).
PyObject* functional_collectives(const char* name) {
  PyObject* module = PyImport_ImportModule("torch.distributed._functional_collectives");
  if (module == nullptr) return nullptr;
  PyObject* attribute = PyObject_GetAttrString(module, name);
  Py_DECREF(module);
  return attribute;
}

// `result` (a new reference, consumed) as an AsyncCollectiveTensor when the call left the
// caller's wait to it, else itself. A result that records a backward is wrapped by torch's own
// differentiable wrapping (_maybe_wrap_tensor), so that its gradient reaches the call's backward;
// any other, by the class itself (no Python op in between).
PyObject* maybe_async(PyObject* result) {
  if (result == nullptr || !transport::join_request().deferred) return result;
  static PyObject* wrap_plain = nullptr;  // both kept for the process's life, once found
  static PyObject* wrap_recorded = nullptr;
  PyObject*& wrap = THPVariable_Unpack(result).requires_grad() ? wrap_recorded : wrap_plain;
  if (wrap == nullptr)
    wrap = functional_collectives(&wrap == &wrap_plain ? "AsyncCollectiveTensor"
                                                       : "_maybe_wrap_tensor");
  if (wrap == nullptr) {
    Py_DECREF(result);
    return nullptr;
  }
  PyObject* wrapped = PyObject_CallOneArg(wrap, result);
  Py_DECREF(result);
  return wrapped;
}

// Conversions of the method's arguments: false (no Python error set) for anything else.
bool as_int(PyObject* o, int64_t* out) {
  if (!PyLong_CheckExact(o)) return false;  // (a bool is not one: PyBool is a subclass)
  int overflow = 0;
  const long long value = PyLong_AsLongLongAndOverflow(o, &overflow);
  if (overflow != 0 || (value == -1 && PyErr_Occurred())) {
    PyErr_Clear();
    return false;
  }
  *out = value;
  return true;
}

bool as_string(PyObject* o, std::string* out) {
  if (!PyUnicode_CheckExact(o)) return false;
  Py_ssize_t size = 0;
  const char* text = PyUnicode_AsUTF8AndSize(o, &size);
  if (text == nullptr) {
    PyErr_Clear();
    return false;
  }
  out->assign(text, static_cast<size_t>(size));
  return true;
}

bool as_splits(PyObject* o, std::optional<std::vector<int64_t>>* out) {
  if (o == Py_None) return true;
  if (!PyList_CheckExact(o)) return false;
  std::vector<int64_t> values(static_cast<size_t>(PyList_GET_SIZE(o)));
  for (size_t i = 0; i < values.size(); ++i)
    if (!as_int(PyList_GET_ITEM(o, static_cast<Py_ssize_t>(i)), &values[i])) return false;
  *out = std::move(values);
  return true;
}

Splits splits_view(const std::optional<std::vector<int64_t>>& splits) {
  return splits ? Splits(*splits) : std::nullopt;
}

// One argument of kernel type T, taken from Python: `parse` is false (no Python error set) for
// any other Python type than the methods pass, and `get` hands the value to the typed call.
template <typename T>
struct Arg;

template <>
struct Arg<int64_t> {
  int64_t value = 0;
  bool parse(PyObject* o) { return as_int(o, &value); }
  int64_t get() const { return value; }
};

template <>
struct Arg<std::string> {
  std::string value;
  bool parse(PyObject* o) { return as_string(o, &value); }
  std::string get() { return std::move(value); }
};

template <>
struct Arg<Splits> {
  std::optional<std::vector<int64_t>> value;
  bool parse(PyObject* o) { return as_splits(o, &value); }
  Splits get() const { return splits_view(value); }
};

template <>
struct Arg<bool> {
  bool value = false;
  bool parse(PyObject* o) {
    value = o == Py_True;
    return value || o == Py_False;
  }
  bool get() const { return value; }
};

// The rank: an int (the methods always pass theirs; None is declined).
template <>
struct Arg<std::optional<int64_t>> {
  int64_t value = 0;
  bool parse(PyObject* o) { return as_int(o, &value); }
  std::optional<int64_t> get() const { return value; }
};

// A call's arguments after x, one Arg per entry of the op's list (call_args.h), parsed in
// schema order by `parse` and handed on in that order by FU_GET.
#define FU_FIELD(type, name, schema) Arg<type> name;
#define FU_PARSE(type, name, schema) &&a->name.parse(args[i++])
#define FU_GET(type, name, schema) , a.name.get()

struct OwnedArguments {
  FU_OWNED_ARGS(FU_FIELD)
};

struct BorrowedArguments {
  FU_BORROWED_ARGS(FU_FIELD)
};

// x: a plain tensor with no torch-function mode active (both are handled before the dispatcher,
// in torch.ops' Python argument parsing).
bool plain_input(PyObject* x) {
  return THPVariable_CheckExact(x) && !at::impl::torch_function_mode_enabled();
}

bool parse(PyObject* const* args, OwnedArguments* a) {
  Py_ssize_t i = 1;
  return plain_input(args[0]) FU_OWNED_ARGS(FU_PARSE);
}

bool parse(PyObject* const* args, BorrowedArguments* a) {
  Py_ssize_t i = 1;
  return plain_input(args[0]) FU_BORROWED_ARGS(FU_PARSE);
}

// Calls `op(x)` (the typed op call, x the unpacked tensor) without the GIL, as torch.ops does
// (the call may wait: a rendezvous), with the caller's wait deferred when `defer`, and returns its
// result to Python (an AsyncCollectiveTensor where it was deferred). Below autograd, unless the
// call records a backward (x requires grad, grad mode on): then through the op's Autograd kernel.
template <typename Op>
PyObject* call_op(PyObject* input, bool defer, Op&& op) {
  const at::Tensor& x = THPVariable_Unpack(input);
  at::Tensor out;
  {
    pybind11::gil_scoped_release no_gil;
    std::optional<at::AutoDispatchBelowAutograd> below;
    if (!(x.requires_grad() && c10::GradMode::is_enabled())) below.emplace();
    transport::JoinRequest& join = transport::join_request();
    join.defer = defer;
    join.deferred = false;  // (a call that never reaches a group, a Meta one, defers nothing)
    try {
      out = op(x);
    } catch (...) {
      join.defer = false;
      throw;
    }
    join.defer = false;
  }
  return maybe_async(THPVariable_Wrap(std::move(out)));
}

PyObject* owned(PyObject* /*module*/, PyObject* const* args, Py_ssize_t count) {
  HANDLE_TH_ERRORS
  OwnedArguments a;
  if (count != kOwnedCount || !parse(args, &a)) Py_RETURN_NOTIMPLEMENTED;
  return call_op(args[0], true,
                 [&a](const at::Tensor& x) { return owned_op().call(x FU_OWNED_ARGS(FU_GET)); });
  END_HANDLE_TH_ERRORS
}

PyObject* borrowed(PyObject* /*module*/, PyObject* const* args, Py_ssize_t count) {
  HANDLE_TH_ERRORS
  BorrowedArguments a;
  if (count != kBorrowedCount || !parse(args, &a)) Py_RETURN_NOTIMPLEMENTED;
  return call_op(args[0], true, [&a](const at::Tensor& x) {
    return borrowed_op().call(x FU_BORROWED_ARGS(FU_GET));
  });
  END_HANDLE_TH_ERRORS
}

PyObject* owned_out(PyObject* /*module*/, PyObject* const* args, Py_ssize_t count) {
  HANDLE_TH_ERRORS
  OwnedArguments a;
  if (count != kOwnedCount + 1 || !parse(args, &a) || !THPVariable_CheckExact(args[kOwnedCount]))
    Py_RETURN_NOTIMPLEMENTED;
  at::Tensor out = THPVariable_Unpack(args[kOwnedCount]);
  // Ready in the caller's stream order: a caller that reads its own `out` rather than the
  // returned tensor (the usual way with a persistent buffer) must never see it half-written.
  return call_op(args[0], false, [&a, &out](const at::Tensor& x) {
    return out_op().call(x FU_OWNED_ARGS(FU_GET), out);
  });
  END_HANDLE_TH_ERRORS
}

PyMethodDef methods[] = {
    {"owned", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&owned)), METH_FASTCALL,
     "owned(x" FU_OWNED_ARGS(FU_LISTED) "): the op all_to_all_single_4d (below autograd "
                                        "unless it records a backward), or "
                                        "NotImplemented (call torch.ops instead)"},
    {"borrowed", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&borrowed)),
     METH_FASTCALL,
     "borrowed(x" FU_BORROWED_ARGS(FU_LISTED) "): the op all_to_all_single_4d_borrowed below "
                                              "autograd, or NotImplemented"},
    {"owned_out", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&owned_out)),
     METH_FASTCALL,
     "owned_out(x" FU_OWNED_ARGS(FU_LISTED) ", out): the op all_to_all_single_4d_out below "
                                            "autograd, or NotImplemented"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

PyMethodDef* fast_entry_methods() {
  return methods;
}

}  // namespace fast_ulysses::ops
