// hybridplan._C: the torch-free planner for Python. Exceptions crossing into Python:
//   hybridplan::InputError      -> ValueError            (bad JSON, bad field, bad option)
//   hybridplan::InfeasibleError -> _C.InfeasibleError    (a RuntimeError subclass: the input is
//                                   valid but no plan fits; the CLI's exit 3)
//   anything else               -> RuntimeError          (InternalError: a bug in hybridplan)
#include <pybind11/pybind11.h>

#include "common/error.h"
#include "python/bindings.h"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "hybridplan planner bindings (JSON text in, JSON text out; see hybridplan.planner)";

  // InfeasibleError is a RuntimeError rather than a ValueError: nothing the caller passed is
  // malformed, the request simply has no feasible plan (as the CLI separates exit 3 from 2).
  py::register_exception<hybridplan::InfeasibleError>(m, "InfeasibleError", PyExc_RuntimeError);
  // pybind11 would map InputError (a std::invalid_argument) to ValueError too; saying so here
  // keeps the contract explicit if InputError's base ever changes.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const hybridplan::InputError& e) {
      py::set_error(PyExc_ValueError, e.what());
    }
  });

  hybridplan::python::bind_contracts(m);
  hybridplan::python::bind_planner(m);
  hybridplan::python::bind_tools(m);
  hybridplan::python::bind_defaults(m);
}
