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

#include "transport/call_work.h"

#include <optional>
#include <string>
#include <vector>

namespace fast_ulysses::ops {
namespace {

// The kernels' signature (cuda_ops.cpp, plan_ops.h's Meta kernels): a typed call must match it.
using Splits = std::optional<at::IntArrayRef>;
using OwnedSignature = at::Tensor(const at::Tensor&, int64_t, std::string, std::string, Splits,
                                  Splits, std::string, std::optional<int64_t>);
using BorrowedSignature = at::Tensor(const at::Tensor&, int64_t, std::string, std::string, Splits,
                                     Splits, std::string, bool, std::optional<int64_t>);
using OutSignature = at::Tensor&(const at::Tensor&, int64_t, std::string, std::string, Splits,
                                 Splits, std::string, std::optional<int64_t>, at::Tensor&);

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

// The arguments the ops share, in schema order: x, mode, tag, group_name, seq_splits,
// head_splits, layout, then the rank (at `rank_at`: the borrowed op's barrier comes before it,
// the out op's `out` after it).
struct Arguments {
  PyObject* x = nullptr;
  int64_t mode = 0;
  std::string tag, group_name, layout;
  std::optional<std::vector<int64_t>> seq_splits, head_splits;
  int64_t rank = 0;
};

bool parse(PyObject* const* args, Py_ssize_t count, Py_ssize_t expected, Py_ssize_t rank_at,
           Arguments* a) {
  if (count != expected) return false;
  a->x = args[0];
  return THPVariable_CheckExact(a->x) && !at::impl::torch_function_mode_enabled() &&
         as_int(args[1], &a->mode) && as_string(args[2], &a->tag) &&
         as_string(args[3], &a->group_name) && as_splits(args[4], &a->seq_splits) &&
         as_splits(args[5], &a->head_splits) && as_string(args[6], &a->layout) &&
         as_int(args[rank_at], &a->rank);
}

// Calls `op(x)` (the typed op call, x the unpacked tensor) without the GIL, as torch.ops does
// (the call may wait: a rendezvous), below autograd, with the caller's wait deferred when
// `defer`, and returns its result to Python (an AsyncCollectiveTensor where it was deferred).
template <typename Op>
PyObject* call_below_autograd(const Arguments& a, bool defer, Op&& op) {
  const at::Tensor& x = THPVariable_Unpack(a.x);
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
  Arguments a;
  if (!parse(args, count, 8, 7, &a)) Py_RETURN_NOTIMPLEMENTED;
  return call_below_autograd(a, true, [&a](const at::Tensor& x) {
    return owned_op().call(x, a.mode, std::move(a.tag), std::move(a.group_name),
                           splits_view(a.seq_splits), splits_view(a.head_splits),
                           std::move(a.layout), a.rank);
  });
  END_HANDLE_TH_ERRORS
}

PyObject* borrowed(PyObject* /*module*/, PyObject* const* args, Py_ssize_t count) {
  HANDLE_TH_ERRORS
  Arguments a;
  if (!parse(args, count, 9, 8, &a) || (args[7] != Py_True && args[7] != Py_False))
    Py_RETURN_NOTIMPLEMENTED;
  const bool barrier = args[7] == Py_True;
  return call_below_autograd(a, true, [&a, barrier](const at::Tensor& x) {
    return borrowed_op().call(x, a.mode, std::move(a.tag), std::move(a.group_name),
                              splits_view(a.seq_splits), splits_view(a.head_splits),
                              std::move(a.layout), barrier, a.rank);
  });
  END_HANDLE_TH_ERRORS
}

PyObject* owned_out(PyObject* /*module*/, PyObject* const* args, Py_ssize_t count) {
  HANDLE_TH_ERRORS
  Arguments a;
  if (!parse(args, count, 9, 7, &a) || !THPVariable_CheckExact(args[8]))
    Py_RETURN_NOTIMPLEMENTED;
  at::Tensor out = THPVariable_Unpack(args[8]);
  // Ready in the caller's stream order: a caller that reads its own `out` rather than the
  // returned tensor (the usual way with a persistent buffer) must never see it half-written.
  return call_below_autograd(a, false, [&a, &out](const at::Tensor& x) {
    return out_op().call(x, a.mode, std::move(a.tag), std::move(a.group_name),
                         splits_view(a.seq_splits), splits_view(a.head_splits),
                         std::move(a.layout), a.rank, out);
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
     "owned(x, mode, tag, group_name, seq_splits, head_splits, layout, rank): the op "
     "all_to_all_single_4d below autograd, or NotImplemented (call torch.ops instead)"},
    {"borrowed", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&borrowed)),
     METH_FASTCALL,
     "borrowed(x, mode, tag, group_name, seq_splits, head_splits, layout, barrier, rank): the "
     "op all_to_all_single_4d_borrowed below autograd, or NotImplemented"},
    {"owned_out", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&owned_out)),
     METH_FASTCALL,
     "owned_out(x, mode, tag, group_name, seq_splits, head_splits, layout, rank, out): the op "
     "all_to_all_single_4d_out below autograd, or NotImplemented"},
    {"set_defer", &set_defer, METH_O,
     "set_defer(flag): whether this thread's next calls through torch.ops leave the caller's "
     "wait to their result (an AsyncCollectiveTensor); returns whether the last call did"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

PyMethodDef* fast_entry_methods() { return methods; }

}  // namespace fast_ulysses::ops
