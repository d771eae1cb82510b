//! tessera's [`Error`] as Python exceptions, with the same message text.
//!
//! Each class derives from `TesseraError` and from the built-in exception a Python caller
//! expects, so `except ValueError` and `except tessera.TesseraError` both work:
//!
//! | Rust variant                      | Python class                                   |
//! |-----------------------------------|------------------------------------------------|
//! | `InvalidArgument`                 | `InvalidArgumentError(TesseraError, ValueError)` |
//! | `Unsupported`                     | `UnsupportedError(TesseraError, NotImplementedError)` |
//! | `NoDriver`, `NoDevice`, `NoNvrtc` | `NoGpuError(TesseraError, RuntimeError)`       |
//! | `Cuda`                            | `CudaError(TesseraError, RuntimeError)`        |
//! | `Compile`                         | `CompileError(TesseraError, RuntimeError)`     |
//! | `Io`                              | `TesseraIOError(TesseraError, OSError)`        |
//! | `OutOfPages`                      | `OutOfPagesError(TesseraError, MemoryError)`   |

use pyo3::exceptions::{PyException, PyMemoryError, PyNotImplementedError, PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};
use tessera::Error;

/// The classes, created once per process by [`register`].
struct Classes {
    base: Py<PyType>,
    invalid: Py<PyType>,
    unsupported: Py<PyType>,
    no_gpu: Py<PyType>,
    cuda: Py<PyType>,
    compile: Py<PyType>,
    io: Py<PyType>,
    out_of_pages: Py<PyType>,
}

static CLASSES: PyOnceLock<Classes> = PyOnceLock::new();

/// `type(name, bases, {"__doc__": doc, "__module__": "tessera"})`.
fn make_class<'py>(py: Python<'py>, name: &str, bases: &[Bound<'py, PyType>], doc: &str) -> PyResult<Py<PyType>> {
    let dict = PyDict::new(py);
    dict.set_item("__doc__", doc)?;
    dict.set_item("__module__", "tessera")?;
    let bases = PyTuple::new(py, bases)?;
    let cls = py.get_type::<PyType>().call1((name, bases, dict))?;
    Ok(cls.cast_into::<PyType>()?.unbind())
}

fn classes(py: Python<'_>) -> PyResult<&Classes> {
    CLASSES.get_or_try_init(py, || {
        let base = make_class(
            py,
            "TesseraError",
            &[py.get_type::<PyException>()],
            "Base class of every error tessera raises.",
        )?;
        let b = base.bind(py).clone();
        let sub = |name: &str, builtin: Bound<'_, PyType>, doc: &str| make_class(py, name, &[b.clone(), builtin], doc);
        Ok(Classes {
            invalid: sub(
                "InvalidArgumentError",
                py.get_type::<PyValueError>(),
                "An argument broke a documented rule (shape, dtype, stride, range); the message names it.",
            )?,
            unsupported: sub(
                "UnsupportedError",
                py.get_type::<PyNotImplementedError>(),
                "A valid but unsupported argument or combination; the message says what is supported.",
            )?,
            no_gpu: sub(
                "NoGpuError",
                py.get_type::<PyRuntimeError>(),
                "No usable GPU: the CUDA driver, a device or NVRTC is missing. The message says what was looked for.",
            )?,
            cuda: sub(
                "CudaError",
                py.get_type::<PyRuntimeError>(),
                "A CUDA driver call failed; the message names the call.",
            )?,
            compile: sub(
                "CompileError",
                py.get_type::<PyRuntimeError>(),
                "NVRTC rejected a kernel; the message carries the kernel, options and log.",
            )?,
            io: sub(
                "TesseraIOError",
                py.get_type::<PyOSError>(),
                "A file-system error (the kernel cache).",
            )?,
            out_of_pages: sub(
                "OutOfPagesError",
                py.get_type::<PyMemoryError>(),
                "The paged KV cache has no free or evictable page; nothing was changed (preempt a sequence).",
            )?,
            base,
        })
    })
}

/// Adds the exception classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let c = classes(m.py())?;
    for cls in [
        &c.base,
        &c.invalid,
        &c.unsupported,
        &c.no_gpu,
        &c.cuda,
        &c.compile,
        &c.io,
        &c.out_of_pages,
    ] {
        let cls = cls.bind(m.py());
        m.add(cls.name()?, cls)?;
    }
    Ok(())
}

/// The Python exception for a tessera error, carrying its `Display` text.
pub fn to_py(e: Error) -> PyErr {
    Python::attach(|py| {
        let c = match classes(py) {
            Ok(c) => c,
            Err(err) => return err,
        };
        let cls = match &e {
            Error::InvalidArgument { .. } => &c.invalid,
            Error::Unsupported(_) => &c.unsupported,
            Error::NoDriver(_) | Error::NoDevice(_) | Error::NoNvrtc(_) => &c.no_gpu,
            Error::Cuda { .. } => &c.cuda,
            Error::Compile { .. } => &c.compile,
            Error::Io { .. } => &c.io,
            Error::OutOfPages { .. } => &c.out_of_pages,
        };
        PyErr::from_type(cls.bind(py).clone(), e.to_string())
    })
}

/// An `InvalidArgumentError` for a rule this module checks itself.
pub fn invalid(arg: &'static str, rule: impl std::fmt::Display) -> PyErr {
    to_py(Error::invalid(arg, rule))
}

/// `Result<T, tessera::Error>` into `PyResult<T>`.
pub trait IntoPy<T> {
    fn py_err(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for tessera::Result<T> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}
