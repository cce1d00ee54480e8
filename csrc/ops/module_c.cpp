// `import fast_ulysses._C` loads this library; its TORCH_LIBRARY blocks (schemas.cpp) register the
// ops. The module itself holds what Python only asks about, which needs no op: the rules the
// torch fallback and the Python API apply (functions) and the definitions they read (constants,
// made at import from the C++ ones). A refusal is the op's would-have-been error: ValueError
// with the rule's message (c10::ValueError), RuntimeError for a caller's bug; an argument of the
// wrong type is a TypeError naming it (the package passes checked values).
#include <Python.h>

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "env/env.h"
#include "ops/autograd_kernels.h"
#include "ops/call_args.h"
#include "ops/norm_rope_ops.h"
#include "ops/plan_ops.h"
#include "plan/group_stats.h"
#include "plan/tag_rules.h"

namespace {

namespace ops = fast_ulysses::ops;

// One METH_FASTCALL call's arguments, converted by position (a TypeError names a bad one).
class Arguments {
 public:
  Arguments(const char* function, PyObject* const* args, Py_ssize_t count, Py_ssize_t expected)
      : function_(function), args_(args) {
    if (count != expected)
      throw torch::TypeError(std::string(function) + "() takes " + std::to_string(expected) +
                             " arguments (" + std::to_string(count) + " given)");
  }

  int64_t integer(Py_ssize_t i, const char* name) const {
    int overflow = 0;
    const long long value =
        PyLong_Check(args_[i]) ? PyLong_AsLongLongAndOverflow(args_[i], &overflow) : -1;
    if (!PyLong_Check(args_[i]) || overflow != 0) refuse(i, name, "an int64 int");
    return value;
  }

  bool boolean(Py_ssize_t i, const char* name) const {
    if (!PyBool_Check(args_[i])) refuse(i, name, "a bool");
    return args_[i] == Py_True;
  }

  std::string string(Py_ssize_t i, const char* name) const {
    Py_ssize_t size = 0;
    const char* text =
        PyUnicode_Check(args_[i]) ? PyUnicode_AsUTF8AndSize(args_[i], &size) : nullptr;
    if (text == nullptr) {
      PyErr_Clear();
      refuse(i, name, "a str");
    }
    return std::string(text, static_cast<size_t>(size));
  }

  std::vector<int64_t> integers(Py_ssize_t i, const char* name) const {
    if (!PyList_Check(args_[i]) && !PyTuple_Check(args_[i])) refuse(i, name, "a list of ints");
    const Py_ssize_t size = PySequence_Fast_GET_SIZE(args_[i]);
    PyObject** items = PySequence_Fast_ITEMS(args_[i]);
    std::vector<int64_t> values(static_cast<size_t>(size));
    for (Py_ssize_t k = 0; k < size; ++k) {
      int overflow = 0;
      if (!PyLong_Check(items[k])) refuse(i, name, "a list of ints");
      values[k] = PyLong_AsLongLongAndOverflow(items[k], &overflow);
      if (overflow != 0) refuse(i, name, "a list of int64 ints");
    }
    return values;
  }

  const at::Tensor& tensor(Py_ssize_t i, const char* name) const {
    if (!THPVariable_Check(args_[i])) refuse(i, name, "a torch.Tensor");
    return THPVariable_Unpack(args_[i]);
  }

 private:
  [[noreturn]] void refuse(Py_ssize_t i, const char* name, const char* rule) const {
    throw torch::TypeError(std::string(function_) + "(): " + name + " must be " + rule + ", not " +
                           Py_TYPE(args_[i])->tp_name);
  }

  const char* function_;
  PyObject* const* args_;
};

PyObject* to_python(const std::vector<int64_t>& values) {
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(values.size()));
  for (size_t k = 0; list != nullptr && k < values.size(); ++k)
    PyList_SET_ITEM(list, static_cast<Py_ssize_t>(k), PyLong_FromLongLong(values[k]));
  return list;
}

template <typename Names>
PyObject* to_tuple(const Names& names) {
  PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(std::size(names)));
  Py_ssize_t k = 0;
  for (const auto& name : names) {
    if (tuple == nullptr) break;
    PyTuple_SET_ITEM(tuple, k++, PyUnicode_FromString(std::string(name).c_str()));
  }
  return tuple;
}

// -- the functions ------------------------------------------------------------------------

// env_switch(name) -> bool: the 0|1 switch `name` of csrc/env/env.h, its default when unset or
// empty (ValueError naming the variable for a bad value).
PyObject* env_switch(PyObject*, PyObject* const* args, Py_ssize_t count) {
  HANDLE_TH_ERRORS
  Arguments a("env_switch", args, count, 1);
  return PyBool_FromLong(fast_ulysses::switch_value(a.string(0, "name")));
  END_HANDLE_TH_ERRORS
}

// check_env(): parses every FAST_ULYSSES_* setting (ValueError for the first bad value).
PyObject* check_env(PyObject*, PyObject*) {
  HANDLE_TH_ERRORS
  fast_ulysses::check_env();
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

// check_group(world_size, rank): the plan's rule for a group (1 <= world_size <=
// max_world_size, 0 <= rank < world_size), for groups that check it before any call.
PyObject* check_group(PyObject*, PyObject* const* args, Py_ssize_t count) {
  HANDLE_TH_ERRORS
  Arguments a("check_group", args, count, 2);
  ops::check_group_op(a.integer(0, "world_size"), a.integer(1, "rank"));
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

// check_tag_use(tag, tags_so_far, known, deferred) and window_for_call(tag, bytes, held_bytes,
// sealed) -> int: the per-tag rules of csrc/plan/tag_rules.h for the torch fallback (the
// transport applies them itself): a new tag past max_tags, or a deferred tag before barrier(),
// raises ValueError; window_for_call returns the bytes the tag's window holds after the call
// (held_bytes -1: none yet) and raises where a sealed pool has no room for it.
PyObject* check_tag_use(PyObject*, PyObject* const* args, Py_ssize_t count) {
  HANDLE_TH_ERRORS
  Arguments a("check_tag_use", args, count, 4);
  ops::check_tag_use_op(a.string(0, "tag"), a.integer(1, "tags_so_far"), a.boolean(2, "known"),
                        a.boolean(3, "deferred"));
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

PyObject* window_for_call(PyObject*, PyObject* const* args, Py_ssize_t count) {
  HANDLE_TH_ERRORS
  Arguments a("window_for_call", args, count, 4);
  return PyLong_FromLongLong(ops::window_for_call_op(a.string(0, "tag"), a.integer(1, "bytes"),
                                                     a.integer(2, "held_bytes"),
                                                     a.boolean(3, "sealed")));
  END_HANDLE_TH_ERRORS
}

// shapes(world_size, rank, mode, batch, head_dim, seq_splits, head_splits, layout) ->
// (input_shape, output_shape): rank `rank`'s shapes for explicit splits, from the plan.
PyObject* shapes(PyObject*, PyObject* const* args, Py_ssize_t count) {
  HANDLE_TH_ERRORS
  Arguments a("shapes", args, count, 8);
  auto [input, output] =
      ops::shapes_op(a.integer(0, "world_size"), a.integer(1, "rank"), a.integer(2, "mode"),
                     a.integer(3, "batch"), a.integer(4, "head_dim"), a.integers(5, "seq_splits"),
                     a.integers(6, "head_splits"), a.string(7, "layout"));
  PyObject* pair = PyTuple_New(2);
  if (pair == nullptr) return nullptr;
  for (const auto& [k, shape] : {std::pair{0, &input}, std::pair{1, &output}}) {
    PyObject* list = to_python(*shape);
    if (list == nullptr) {
      Py_DECREF(pair);
      return nullptr;
    }
    PyTuple_SET_ITEM(pair, k, list);  // (steals the reference)
  }
  return pair;
  END_HANDLE_TH_ERRORS
}

// check_input(x) -> int: the input tensor's rules (4-d, a 1-, 2- or 4-byte non-bool,
// non-complex dtype; any strides) for every group: the element size, or ValueError. Any device.
PyObject* check_input(PyObject*, PyObject* x) {
  HANDLE_TH_ERRORS
  Arguments a("check_input", &x, 1, 1);
  return PyLong_FromLongLong(ops::checked_element_size(a.tensor(0, "x")));
  END_HANDLE_TH_ERRORS
}

// check_borrowed_grad(x, entry): the borrowed entry points' autograd rule, ValueError naming
// `entry` when x requires grad with grad mode on (the borrowed op's Autograd kernel asks it too).
PyObject* check_borrowed_grad(PyObject*, PyObject* const* args, Py_ssize_t count) {
  HANDLE_TH_ERRORS
  Arguments a("check_borrowed_grad", args, count, 2);
  ops::check_borrowed_grad(a.tensor(0, "x"), a.string(1, "entry"));
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

// set_backward_check(hook): the owned op's backward hands its call to `hook` (a callable) before
// anything is sent, or to nothing (None): FAST_ULYSSES_DEBUG's check (autograd_kernels.h).
PyObject* set_backward_check(PyObject*, PyObject* hook) {
  HANDLE_TH_ERRORS
  if (hook != Py_None && !PyCallable_Check(hook))
    throw torch::TypeError("set_backward_check() takes a callable or None");
  ops::set_backward_check(hook);
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

template <typename F>
constexpr PyCFunction fastcall(F* f) {
  return reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(f));
}

PyMethodDef methods[] = {
    {"env_switch", fastcall(&env_switch), METH_FASTCALL, "env_switch(name) -> bool"},
    {"check_env", &check_env, METH_NOARGS, "check_env()"},
    {"check_group", fastcall(&check_group), METH_FASTCALL, "check_group(world_size, rank)"},
    {"check_tag_use", fastcall(&check_tag_use), METH_FASTCALL,
     "check_tag_use(tag, tags_so_far, known, deferred)"},
    {"window_for_call", fastcall(&window_for_call), METH_FASTCALL,
     "window_for_call(tag, bytes, held_bytes, sealed) -> int"},
    {"shapes", fastcall(&shapes), METH_FASTCALL,
     "shapes(world_size, rank, mode, batch, head_dim, seq_splits, head_splits, layout) -> "
     "(input_shape, output_shape)"},
    {"check_input", &check_input, METH_O, "check_input(x) -> element size"},
    {"check_borrowed_grad", fastcall(&check_borrowed_grad), METH_FASTCALL,
     "check_borrowed_grad(x, entry)"},
    {"set_backward_check", &set_backward_check, METH_O,
     "set_backward_check(hook): the owned op's backward hands hook(group_name, grad, mode, tag, "
     "seq_splits, head_splits, layout) its call first; None: to nothing"},
    {nullptr, nullptr, 0, nullptr}};

// -- the constants --------------------------------------------------------------------------

constexpr const char* kOwnedArguments[] = {"x" FU_OWNED_ARGS(FU_NAME)};
constexpr const char* kBorrowedArguments[] = {"x" FU_BORROWED_ARGS(FU_NAME)};
constexpr const char* kFusedArguments[] = {"x" FU_FUSED_ARGS(FU_NAME)};

PyObject* limits() {
  auto [names, values] = ops::limits_op();
  PyObject* dict = PyDict_New();
  for (size_t k = 0; dict != nullptr && k < names.size(); ++k) {
    PyObject* value = PyLong_FromLongLong(values[k]);
    if (value == nullptr || PyDict_SetItemString(dict, names[k].c_str(), value) != 0) {
      Py_XDECREF(value);
      Py_DECREF(dict);
      return nullptr;
    }
    Py_DECREF(value);
  }
  return dict;
}

// Adds `value` (a new reference, consumed; null with a Python error set) as module.name.
bool add(PyObject* module, const char* name, PyObject* value) {
  if (value == nullptr) return false;
  if (PyModule_AddObject(module, name, value) == 0) return true;
  Py_DECREF(value);
  return false;
}

bool add_constants(PyObject* m) {
  auto [norms, rope_styles] = ops::norm_rope_choices_op();
  // LIMITS: {max_world_size, max_bytes, copy_engine_alignment, max_tags} (plan.h, tag_rules.h).
  // LAYOUTS: every layout name, in enum order. DESCRIPTOR_FIELDS: a descriptor row's columns,
  // in order. GROUP_STATS_KEYS: the keys of both groups' stats(), in order. NORMS and
  // ROPE_STYLES: the names norm= and rope_style= take. *_ARGUMENTS: the ops' argument names,
  // in schema order (call_args.h). BACKWARD_SUFFIX: what
  // a backward's tag appends to its forward's (tag_rules.h).
  return add(m, "LIMITS", limits()) && add(m, "LAYOUTS", to_tuple(ops::layouts_op())) &&
         add(m, "DESCRIPTOR_FIELDS", to_tuple(ops::descriptor_fields())) &&
         add(m, "GROUP_STATS_KEYS", to_tuple(fast_ulysses::kStatNames)) &&
         add(m, "NORMS", to_tuple(norms)) && add(m, "ROPE_STYLES", to_tuple(rope_styles)) &&
         add(m, "OWNED_ARGUMENTS", to_tuple(kOwnedArguments)) &&
         add(m, "BORROWED_ARGUMENTS", to_tuple(kBorrowedArguments)) &&
         add(m, "FUSED_ARGUMENTS", to_tuple(kFusedArguments)) &&
         add(m, "BACKWARD_SUFFIX", PyUnicode_FromString(fast_ulysses::kBackwardSuffix));
}

PyModuleDef module = {PyModuleDef_HEAD_INIT,
                      "_C",
                      "fast-ulysses ops (plan, Meta kernels), and the rules and constants "
                      "Python asks about",
                      -1,
                      methods,
                      nullptr,
                      nullptr,
                      nullptr,
                      nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__C(void) {
  PyObject* m = PyModule_Create(&module);
  if (m == nullptr) return nullptr;
  try {
    if (add_constants(m)) return m;
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_ImportError, error.what());
  }
  Py_DECREF(m);
  return nullptr;
}
