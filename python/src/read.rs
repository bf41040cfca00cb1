//! Reading Python arguments: each tensor once into the library's [`TensorDesc`] (address, shape,
//! strides, element type, device) — a `torch.Tensor` through DLPack (`crate::dlpack`), other
//! torch-like tensors through their attributes (`data_ptr()`, `shape`, `stride()`, `dtype`,
//! `device`), objects with `__cuda_array_interface__` (CuPy, Numba, …) — and the
//! Python-level shape of a call's arguments (lists with one tensor per group, floats). What a
//! tensor must be is the library's rule book (`nvfp4_gemm::tensor`): nothing here checks it.

use crate::errors::{py_err, type_error, value_error};
use nvfp4_gemm::tensor::{Arg, DType, Dims, TensorDesc, MAX_RANK};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};
use std::sync::Mutex;

/// `torch.dtype` objects seen, by address, with their type: torch's dtypes live as long as the
/// interpreter, so a dtype is named by `str()` once.
static DTYPES: Mutex<Vec<(usize, DType)>> = Mutex::new(vec![]);

/// The type of `torch.dtype` objects, once a torch tensor was seen (objects of other types are
/// never cached: a string's address may be reused).
static DTYPE_TYPE: Mutex<usize> = Mutex::new(0);

/// How an argument is named in reading errors (as the library names it).
fn named(arg: Arg) -> String {
    match arg.group {
        Some(g) => format!("group {g}: `{}`", arg.name),
        None => format!("`{}`", arg.name),
    }
}

/// Integers of a Python sequence (a tuple or `torch.Size`, or a list).
fn ints(obj: &Bound<'_, PyAny>, what: &str, arg: Arg) -> PyResult<Dims> {
    let mut v = [0i64; MAX_RANK];
    let mut n = 0;
    if let Ok(t) = obj.cast::<PyTuple>() {
        for x in t.iter() {
            if n == MAX_RANK {
                return Err(value_error(format!("{}: more than {MAX_RANK} dimensions", named(arg))));
            }
            v[n] = x.extract()?;
            n += 1;
        }
    } else {
        for x in obj.try_iter()? {
            if n == MAX_RANK {
                return Err(value_error(format!("{}: more than {MAX_RANK} dimensions", named(arg))));
            }
            v[n] = x?.extract()?;
            n += 1;
        }
    }
    Dims::new(&v[..n]).ok_or_else(|| value_error(format!("{}: {what} of more than {MAX_RANK}", named(arg))))
}

/// The element type of a `dtype` attribute (a torch dtype, or its name).
fn dtype_of(obj: &Bound<'_, PyAny>) -> PyResult<DType> {
    let address = obj.as_ptr() as usize;
    let ty = obj.get_type().as_ptr() as usize;
    let cacheable = *DTYPE_TYPE.lock().expect("not poisoned") == ty;
    if cacheable {
        if let Some(&(_, t)) = DTYPES.lock().expect("not poisoned").iter().find(|(a, _)| *a == address) {
            return Ok(t);
        }
    }
    let name = obj.str()?;
    let t = DType::from_name(&name.to_cow()?);
    if cacheable {
        DTYPES.lock().expect("not poisoned").push((address, t));
    }
    Ok(t)
}

/// `arg`'s tensor: what the library needs of it, read once. `TypeError` (the library's
/// `WrongType`) for anything that is not a CUDA tensor.
pub fn tensor(obj: &Bound<'_, PyAny>, arg: Arg) -> PyResult<TensorDesc> {
    if obj.is_none() {
        return Err(py_err(arg.wrong_type("is None; a CUDA tensor is needed")));
    }
    // A CUDA `torch.Tensor`, read through DLPack; anything else is read below, which names
    // what is wrong with it.
    if let Some(desc) = crate::dlpack::cuda_tensor(obj) {
        return Ok(desc);
    }
    attributes(obj, arg)
}

/// `obj` read one way (`"auto"`: as [`tensor`] reads it; `"exchange"`, `"to_dlpack"`: that DLPack
/// way only, `None` when it does not read `obj`; `"attributes"`: the attribute reader), for
/// tests that compare the readers.
pub fn tensor_by(obj: &Bound<'_, PyAny>, way: &str) -> PyResult<Option<TensorDesc>> {
    use crate::dlpack::Way;
    let arg = Arg::of("describe_tensor", "tensor");
    Ok(match way {
        "auto" => Some(tensor(obj, arg)?),
        "exchange" => crate::dlpack::read(obj, Way::Exchange),
        "to_dlpack" => crate::dlpack::read(obj, Way::ToDlpack),
        "attributes" => Some(attributes(obj, arg)?),
        _ => return Err(value_error(format!("way: {way:?}; one of auto, exchange, to_dlpack, attributes"))),
    })
}

/// `tensor` through Python attributes and the CUDA array interface.
fn attributes(obj: &Bound<'_, PyAny>, arg: Arg) -> PyResult<TensorDesc> {
    let py = obj.py();
    // A CUDA torch tensor: `get_device()` is its index (-1 elsewhere), at a tenth of the cost of
    // reading `device.type` and `device.index` (H100 machine: 29 against 301 ns per tensor,
    // python/bench/host_profile.py); then four reads.
    if let Ok(index) = obj.call_method0(intern!(py, "get_device")).and_then(|i| i.extract::<i64>()) {
        if index >= 0 {
            if let Ok(desc) = torch_like(obj, arg, Some(index as u32)) {
                return Ok(desc);
            }
        }
    }
    // Other torch-like tensors: their `device` says where they are.
    if obj.hasattr(intern!(py, "data_ptr"))? && obj.hasattr(intern!(py, "stride"))? {
        if let Ok(device) = obj.getattr(intern!(py, "device")) {
            let kind = device.getattr(intern!(py, "type"))?;
            if kind.cast::<PyString>().map_or(true, |s| s.to_cow().map_or(true, |s| s != "cuda")) {
                return Err(py_err(arg.wrong_type(format!("is on {}; a CUDA tensor is needed", device.str()?))));
            }
            let index: Option<u32> = device.getattr(intern!(py, "index"))?.extract()?;
            return torch_like(obj, arg, index);
        }
    }
    if let Ok(cai) = obj.getattr(intern!(py, "__cuda_array_interface__")) {
        return array_interface(&cai, arg);
    }
    if obj.hasattr(intern!(py, "__array_interface__"))? || obj.hasattr(intern!(py, "__array__"))? {
        let name = obj.get_type().name()?;
        return Err(py_err(arg.wrong_type(format!("is a CPU array ({name}); a CUDA tensor is needed"))));
    }
    let name = obj.get_type().name()?;
    Err(py_err(arg.wrong_type(format!("{name} is not a tensor; a CUDA tensor is needed"))))
}

/// A CUDA tensor with torch's attributes (`data_ptr()`, `shape`, `stride()`, `dtype`) on device
/// `index`.
fn torch_like(obj: &Bound<'_, PyAny>, arg: Arg, index: Option<u32>) -> PyResult<TensorDesc> {
    let py = obj.py();
    let dtype_obj = obj.getattr(intern!(py, "dtype"))?;
    if !dtype_obj.is_instance_of::<PyString>() {
        let mut cached = DTYPE_TYPE.lock().expect("not poisoned");
        if *cached == 0 && dtype_obj.get_type().name()?.to_cow()? == "dtype" {
            *cached = dtype_obj.get_type().as_ptr() as usize;
        }
    }
    Ok(TensorDesc {
        ptr: obj.call_method0(intern!(py, "data_ptr"))?.extract()?,
        shape: ints(&obj.getattr(intern!(py, "shape"))?, "shape", arg)?,
        strides: ints(&obj.call_method0(intern!(py, "stride"))?, "strides", arg)?,
        dtype: dtype_of(&dtype_obj)?,
        device: index,
    })
}

/// A `__cuda_array_interface__` dictionary (version 2 or 3), taken to be on the current device.
fn array_interface(cai: &Bound<'_, PyAny>, arg: Arg) -> PyResult<TensorDesc> {
    let cai = cai
        .cast::<PyDict>()
        .map_err(|_| type_error(format!("{}: a malformed __cuda_array_interface__", named(arg))))?;
    let get = |key: &str| {
        cai.get_item(key)?
            .ok_or_else(|| type_error(format!("{}: __cuda_array_interface__ without {key:?}", named(arg))))
    };
    let shape = ints(&get("shape")?, "shape", arg)?;
    let typestr: String = get("typestr")?.extract()?;
    let dtype = match typestr.as_str() {
        "|u1" | "<u1" => DType::U8,
        "|i1" => DType::I8,
        "<f2" => DType::F16,
        "<f4" => DType::F32,
        "<i4" => DType::I32,
        "<u4" => DType::U32,
        "<i8" => DType::I64,
        _ => return Err(py_err(arg.wrong_type(format!("typestr {typestr:?} is not a dtype this package reads")))),
    };
    let item = dtype.bytes() as i64;
    let strides = match cai.get_item("strides")? {
        Some(s) if !s.is_none() => {
            let bytes = ints(&s, "strides", arg)?;
            if bytes.get().iter().any(|b| b % item != 0) {
                return Err(py_err(
                    arg.wrong_type(format!("strides {:?} are not multiples of the element size {item}", bytes.get())),
                ));
            }
            let v: Vec<i64> = bytes.get().iter().map(|b| b / item).collect();
            Dims::new(&v).expect("as many as the shape's")
        }
        _ => {
            let mut v = vec![0i64; shape.get().len()];
            let mut acc = 1;
            for i in (0..v.len()).rev() {
                v[i] = acc;
                acc *= shape.get()[i];
            }
            Dims::new(&v).expect("as many as the shape's")
        }
    };
    let data = get("data")?;
    let ptr: u64 = data
        .cast::<PyTuple>()
        .map_err(|_| type_error(format!("{}: a malformed data entry", named(arg))))?
        .get_item(0)?
        .extract()?;
    Ok(TensorDesc { ptr, shape, strides, dtype, device: None })
}

/// The items of a list or a tuple (subclasses included) by index, without an iterator object;
/// `None` for anything else.
pub fn items<'py>(obj: &Bound<'py, PyAny>) -> Option<Vec<Bound<'py, PyAny>>> {
    if let Ok(l) = obj.cast::<PyList>() {
        return Some(l.iter().collect());
    }
    obj.cast::<PyTuple>().ok().map(|t| t.iter().collect())
}

/// An exact Python `int` (not a `bool`, not another integer-like type) that fits an `i64`.
pub fn exact_int(obj: &Bound<'_, PyAny>) -> Option<i64> {
    if !obj.is_exact_instance_of::<pyo3::types::PyInt>() {
        return None;
    }
    obj.extract().ok()
}

/// An argument that must be a list (or tuple) with one entry per group.
pub fn list<'py>(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Vec<Bound<'py, PyAny>>> {
    if let Some(v) = items(obj) {
        return Ok(v);
    }
    let type_name = obj.get_type().name()?;
    Err(type_error(format!("{name}: {type_name}; expected a list with one tensor per group")))
}

/// Checks that the per-group lists `lists` (name, entries; the first one counts the groups) have
/// one entry per group; returns the group count.
pub fn same_lengths(lists: &[(&str, usize)]) -> PyResult<usize> {
    let (first, groups) = lists[0];
    for &(name, len) in &lists[1..] {
        if len != groups {
            return Err(value_error(format!("{name}: {len} tensors but `{first}` has {groups} groups")));
        }
    }
    Ok(groups)
}

/// A dtype argument (a torch dtype or its name), `None` when not given.
pub fn dtype_arg(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<DType>> {
    match obj {
        None => Ok(None),
        Some(o) if o.is_none() => Ok(None),
        Some(o) => Ok(Some(dtype_of(o)?)),
    }
}

/// Host floats of an `alpha`-like argument: None (1.0), one number, or one per group (`name`:
/// how the error names the argument). A tensor is the caller's business (device alphas).
pub fn floats(obj: Option<&Bound<'_, PyAny>>, groups: usize, name: &str) -> PyResult<Vec<f32>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else { return Ok(vec![1.0; groups]) };
    // A list of Python floats (or ints), read by index.
    if let Some(v) = items(obj) {
        let fast: Option<Vec<f32>> = v
            .iter()
            .map(|x| {
                if x.is_exact_instance_of::<pyo3::types::PyFloat>() {
                    x.extract::<f64>().ok().map(|x| x as f32)
                } else {
                    exact_int(x).map(|i| i as f32)
                }
            })
            .collect();
        if let Some(values) = fast.filter(|f| f.len() == groups) {
            return Ok(values);
        }
    }
    if let Ok(x) = obj.extract::<f64>() {
        if !obj.is_instance_of::<pyo3::types::PyBool>() {
            return Ok(vec![x as f32; groups]);
        }
    }
    let values: Vec<f64> = obj
        .try_iter()
        .map_err(|_| {
            type_error(format!(
                "{name}: {} is not a number or a sequence of numbers",
                obj.get_type().name().map(|n| n.to_string()).unwrap_or_default()
            ))
        })?
        .map(|x| x.and_then(|x| x.extract::<f64>()))
        .collect::<PyResult<_>>()?;
    if values.len() != groups {
        return Err(value_error(format!("{name}: {} values for {groups} groups", values.len())));
    }
    Ok(values.into_iter().map(|x| x as f32).collect())
}

/// `None`, a Python number or a list or tuple: what is never a tensor, told by type checks alone
/// (asking a list for a tensor's attributes raises and clears an `AttributeError` each time).
pub fn is_host_number_or_sequence(obj: &Bound<'_, PyAny>) -> bool {
    obj.is_none()
        || obj.is_instance_of::<PyList>()
        || obj.is_instance_of::<PyTuple>()
        || obj.is_instance_of::<pyo3::types::PyFloat>()
        || obj.is_instance_of::<pyo3::types::PyInt>()
}

/// Whether `obj` is read as a tensor (torch-like or CUDA array interface).
pub fn is_tensor(obj: &Bound<'_, PyAny>) -> bool {
    let py = obj.py();
    obj.hasattr(intern!(py, "data_ptr")).unwrap_or(false)
        || obj.hasattr(intern!(py, "__cuda_array_interface__")).unwrap_or(false)
}
