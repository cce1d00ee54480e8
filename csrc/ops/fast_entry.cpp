// The eager way in for UlyssesGroup's methods: `fast_ulysses._cuda.owned(...)` and `.borrowed(...)`
// take exactly the arguments the methods pass to the ops and call the same op through the
// dispatcher, typed and below autograd (the methods have applied the autograd rules by then).
// What they skip is torch.ops' Python-side work: matching the arguments against the schema,
// boxing them, and, for the borrowed op, its boxed Autograd kernel. That was most of a call's
// host time outside the transport: at P = 8 on an H100 shared by eight ranks, skipping it cut
// a method call's host time by about 10 us
// (benchmarks/results/h100-shared-p8-quick-wan-typed-entry.json).
//
// Still the dispatcher: the profiler records the op, dispatch modes (TorchDispatchMode, fake
// tensors' mode) and the Meta and CPU kernels all see it as they would through torch.ops. What
// these functions are not built for, they decline by returning NotImplemented, and the method
// then calls torch.ops as before: a tensor subclass or a torch-function mode (both are handled
// before the dispatcher, in torch.ops' Python argument parsing), or an argument of any other
// type than the method passes (torch.ops raises its own error for it).
//
// Their calls leave the caller's stream free (transport/call_work.h): a result with a transfer
// still in flight comes back as torch's AsyncCollectiveTensor, whose first use waits for it on
// the device. `set_defer` asks the same of the next calls made through torch.ops on this thread
// (UlyssesGroup's autograd route).
#include "ops/fast_entry.h"

#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include "ops/call_args.h"
#include "transport/call_work.h"

#include <optional>
#include <string>
#include <vector>

namespace fast_ulysses::ops {
namespace {

// The kernels' signatures (call_args.h, which cuda_ops.cpp and the Meta kernels use too): a
// typed call must match them.
using Splits = std::optional<at::IntArrayRef>;
using OwnedSignature = at::Tensor(const at::Tensor& FU_OWNED_ARGS(FU_TYPE));
using BorrowedSignature = at::Tensor(const at::Tensor& FU_BORROWED_ARGS(FU_TYPE));
using OutSignature = at::Tensor&(const at::Tensor& FU_OWNED_ARGS(FU_TYPE), at::Tensor&);

// How many arguments each function takes: x and the list's (the out= op's `out` after them).
constexpr Py_ssize_t kOwnedCount = 1 FU_OWNED_ARGS(FU_COUNT);
constexpr Py_ssize_t kBorrowedCount = 1 FU_BORROWED_ARGS(FU_COUNT);

const c10::TypedOperatorHandle<OwnedSignature>& owned_op() {
  static const auto handle = c10::Dispatcher::singleton()
                                 .findSchemaOrThrow("fast_ulysses::all_to_all_single_4d", "")
                                 .typed<OwnedSignature>();
  return handle;
}

const c10::TypedOperatorHandle<BorrowedSignature>& borrowed_op() {
  static const auto handle =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("fast_ulysses::all_to_all_single_4d_borrowed", "")
          .typed<BorrowedSignature>();
  return handle;
}

const c10::TypedOperatorHandle<OutSignature>& out_op() {
  static const auto handle = c10::Dispatcher::singleton()
                                 .findSchemaOrThrow("fast_ulysses::all_to_all_single_4d_out", "")
                                 .typed<OutSignature>();
  return handle;
}

// torch's AsyncCollectiveTensor class (a new reference each time; null with a Python error set).
PyObject* async_tensor_class() {
  PyObject* module = PyImport_ImportModule("torch.distributed._functional_collectives");
  if (module == nullptr) return nullptr;
  PyObject* cls = PyObject_GetAttrString(module, "AsyncCollectiveTensor");
  Py_DECREF(module);
  return cls;
}

// `result` (a new reference, consumed) as an AsyncCollectiveTensor when the call left the
// caller's wait to it, else itself.
PyObject* maybe_async(PyObject* result) {
  if (result == nullptr || !transport::join_request().deferred) return result;
  static PyObject* cls = async_tensor_class();  // kept for the process's life
  if (cls == nullptr) {
    Py_DECREF(result);
    return nullptr;
  }
  PyObject* wrapped = PyObject_CallOneArg(cls, result);
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
// (the call may wait: a rendezvous), below autograd, with the caller's wait deferred when
// `defer`, and returns its result to Python (an AsyncCollectiveTensor where it was deferred).
template <typename Op>
PyObject* call_below_autograd(PyObject* input, bool defer, Op&& op) {
  const at::Tensor& x = THPVariable_Unpack(input);
  at::Tensor out;
  {
    pybind11::gil_scoped_release no_gil;
    at::AutoDispatchBelowAutograd below;
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
  return call_below_autograd(args[0], true, [&a](const at::Tensor& x) {
    return owned_op().call(x FU_OWNED_ARGS(FU_GET));
  });
  END_HANDLE_TH_ERRORS
}

PyObject* borrowed(PyObject* /*module*/, PyObject* const* args, Py_ssize_t count) {
  HANDLE_TH_ERRORS
  BorrowedArguments a;
  if (count != kBorrowedCount || !parse(args, &a)) Py_RETURN_NOTIMPLEMENTED;
  return call_below_autograd(args[0], true, [&a](const at::Tensor& x) {
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
  return call_below_autograd(args[0], false, [&a, &out](const at::Tensor& x) {
    return out_op().call(x FU_OWNED_ARGS(FU_GET), out);
  });
  END_HANDLE_TH_ERRORS
}

// set_defer(flag): whether this thread's next calls through torch.ops leave the caller's wait
// to their result; returns whether the last call did.
PyObject* set_defer(PyObject* /*module*/, PyObject* flag) {
  transport::JoinRequest& join = transport::join_request();
  const bool deferred = join.deferred;
  join.defer = flag == Py_True;
  join.deferred = false;
  if (deferred) Py_RETURN_TRUE;
  Py_RETURN_FALSE;
}

PyMethodDef methods[] = {
    {"owned", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&owned)), METH_FASTCALL,
     "owned(x" FU_OWNED_ARGS(FU_LISTED) "): the op all_to_all_single_4d below autograd, or "
                                        "NotImplemented (call torch.ops instead)"},
    {"borrowed", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&borrowed)),
     METH_FASTCALL,
     "borrowed(x" FU_BORROWED_ARGS(FU_LISTED) "): the op all_to_all_single_4d_borrowed below "
                                              "autograd, or NotImplemented"},
    {"owned_out", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&owned_out)),
     METH_FASTCALL,
     "owned_out(x" FU_OWNED_ARGS(FU_LISTED) ", out): the op all_to_all_single_4d_out below "
                                            "autograd, or NotImplemented"},
    {"set_defer", &set_defer, METH_O,
     "set_defer(flag): whether this thread's next calls through torch.ops leave the caller's "
     "wait to their result (an AsyncCollectiveTensor); returns whether the last call did"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

PyMethodDef* fast_entry_methods() {
  return methods;
}

}  // namespace fast_ulysses::ops
