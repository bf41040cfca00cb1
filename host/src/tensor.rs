//! Tensor arguments as a binding describes them — address, shape, strides, element type and
//! device, read once from each tensor ([`TensorDesc`]) — and the rules every call of a binding
//! checks on them, here and nowhere else: element types, shapes against each other, contiguity,
//! alignment, one device per call. Each call's function turns its descriptors into what the
//! library's typed calls take (a [`crate::Problem`] and the buffers' [`BufferView`]s), which then check
//! the buffers against the problem as for any caller (lengths, alignment, overlaps).
//!
//! Errors name the argument as the binding's caller wrote it (`group 2: \`a\``) and say whether
//! the argument has the wrong type ([`Error::WrongType`]) or a wrong value (the other variants),
//! so that a binding maps them to its language's exceptions without restating a rule.

use crate::error::{Error, Result};
use crate::problem::{Activations, BufferView, GroupShape, OutputType, TokenKind};
use crate::rules;
use std::fmt;

/// Element types a binding reads (named as PyTorch names them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// `uint8`.
    U8,
    /// `int8`.
    I8,
    /// `float4_e2m1fn_x2`: two e2m1 values per byte, element `2j` in the low nibble.
    Fp4x2,
    /// `float8_e4m3fn`.
    F8E4M3,
    /// `float16`.
    F16,
    /// `bfloat16`.
    Bf16,
    /// `float32`.
    F32,
    /// `int32`.
    I32,
    /// `uint32`.
    U32,
    /// `int64`.
    I64,
    /// Any other type: refused wherever a type is checked.
    Other,
}

impl DType {
    /// Every named type.
    pub const ALL: [DType; 10] = [
        DType::U8,
        DType::I8,
        DType::Fp4x2,
        DType::F8E4M3,
        DType::F16,
        DType::Bf16,
        DType::F32,
        DType::I32,
        DType::U32,
        DType::I64,
    ];

    /// The type's name (PyTorch's, without `torch.`).
    pub const fn name(self) -> &'static str {
        match self {
            DType::U8 => "uint8",
            DType::I8 => "int8",
            DType::Fp4x2 => "float4_e2m1fn_x2",
            DType::F8E4M3 => "float8_e4m3fn",
            DType::F16 => "float16",
            DType::Bf16 => "bfloat16",
            DType::F32 => "float32",
            DType::I32 => "int32",
            DType::U32 => "uint32",
            DType::I64 => "int64",
            DType::Other => "other",
        }
    }

    /// The type of a name (`torch.` prefix allowed), [`DType::Other`] for any other.
    pub fn from_name(name: &str) -> DType {
        let name = name.strip_prefix("torch.").unwrap_or(name);
        DType::ALL.into_iter().find(|t| t.name() == name).unwrap_or(DType::Other)
    }

    /// Bytes per element (0 for [`DType::Other`]).
    pub const fn bytes(self) -> usize {
        match self {
            DType::U8 | DType::I8 | DType::Fp4x2 | DType::F8E4M3 => 1,
            DType::F16 | DType::Bf16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::I64 => 8,
            DType::Other => 0,
        }
    }

    /// The output type of a 16-bit float type.
    pub const fn output(self) -> Option<OutputType> {
        match self {
            DType::F16 => Some(OutputType::F16),
            DType::Bf16 => Some(OutputType::Bf16),
            _ => None,
        }
    }

    /// The type of an output type.
    pub const fn of_output(t: OutputType) -> DType {
        match t {
            OutputType::F16 => DType::F16,
            OutputType::Bf16 => DType::Bf16,
        }
    }

    /// W4A16's activations of a 16-bit float type.
    pub const fn activations(self) -> Option<Activations> {
        match self {
            DType::F16 => Some(Activations::F16),
            DType::Bf16 => Some(Activations::Bf16),
            _ => None,
        }
    }
}

/// Packed e2m1 values: two per byte.
pub const VALUES: &[DType] = &[DType::U8, DType::Fp4x2];
/// e4m3 block scales.
pub const SCALES: &[DType] = &[DType::F8E4M3, DType::U8];
/// 16-bit floats: activations, outputs.
pub const DENSE: &[DType] = &[DType::F16, DType::Bf16];
/// Device-resident group sizes.
pub const SIZES: &[DType] = &[DType::I32, DType::U32];

/// Most dimensions of a described tensor.
pub const MAX_RANK: usize = 8;

/// A shape or strides (in elements), inline.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct Dims {
    len: u8,
    v: [i64; MAX_RANK],
}

impl Dims {
    /// `values` (at most [`MAX_RANK`]; `None` beyond).
    pub fn new(values: &[i64]) -> Option<Dims> {
        if values.len() > MAX_RANK {
            return None;
        }
        let mut v = [0; MAX_RANK];
        v[..values.len()].copy_from_slice(values);
        Some(Dims { len: values.len() as u8, v })
    }

    /// The values.
    pub fn get(&self) -> &[i64] {
        &self.v[..self.len as usize]
    }

    /// The dimensions without a trailing size-1 one (`[rows, cols, 1]` reads as `[rows, cols]`).
    fn trimmed(&self) -> &[i64] {
        match self.get() {
            [rest @ .., 1] if rest.len() >= 2 => rest,
            all => all,
        }
    }
}

impl fmt::Debug for Dims {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.get()).finish()
    }
}

/// A tensor argument: what a binding reads from it, once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorDesc {
    /// Device address of element 0.
    pub ptr: u64,
    /// Extents.
    pub shape: Dims,
    /// Strides, in elements.
    pub strides: Dims,
    /// Element type.
    pub dtype: DType,
    /// CUDA device ordinal, or `None` for "the current device" (objects that do not say).
    pub device: Option<u32>,
}

impl TensorDesc {
    /// Elements.
    pub fn numel(&self) -> usize {
        self.shape.get().iter().map(|&d| d.max(0) as usize).product()
    }

    /// Bytes of its elements.
    pub fn nbytes(&self) -> usize {
        self.numel() * self.dtype.bytes()
    }

    /// Row-major without gaps (size-1 dimensions may have any stride).
    pub fn is_contiguous(&self) -> bool {
        let mut want = 1i64;
        for (&d, &s) in self.shape.get().iter().rev().zip(self.strides.get().iter().rev()) {
            if d != 1 && s != want {
                return false;
            }
            want *= d;
        }
        true
    }

    /// Its elements as a buffer view (address, length in elements).
    pub fn view(&self) -> BufferView {
        BufferView { ptr: self.ptr, len: self.numel() }
    }
}

/// How errors name a tensor argument: its group (for per-group lists) and its name as the
/// binding's caller wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arg {
    /// The call (for arguments that are not per group).
    pub call: &'static str,
    /// The group, for per-group lists.
    pub group: Option<usize>,
    /// The argument's name.
    pub name: &'static str,
}

impl Arg {
    /// Argument `name` of `call`.
    pub const fn of(call: &'static str, name: &'static str) -> Arg {
        Arg { call, group: None, name }
    }

    /// Group `g`'s tensor of the list `name` of `call`.
    pub const fn group(call: &'static str, g: usize, name: &'static str) -> Arg {
        Arg { call, group: Some(g), name }
    }

    /// A wrong value of this argument.
    pub fn invalid(self, reason: impl Into<String>) -> Error {
        let reason = reason.into();
        match self.group {
            Some(group) => Error::InvalidGroup { group, field: self.name, reason },
            None => Error::InvalidArgument { call: self.call, field: self.name, reason },
        }
    }

    /// A wrong type of this argument.
    pub fn wrong_type(self, reason: impl Into<String>) -> Error {
        Error::WrongType { call: self.call, group: self.group, field: self.name, reason: reason.into() }
    }
}

/// `alternatives` in words: `a or b or c`.
fn either(alternatives: &[DType]) -> String {
    alternatives.iter().map(|t| t.name()).collect::<Vec<_>>().join(" or ")
}

/// The checks of one tensor argument.
impl TensorDesc {
    /// Its type is one of `allowed`.
    pub fn require_dtype(&self, arg: Arg, allowed: &[DType]) -> Result<()> {
        if !allowed.contains(&self.dtype) {
            return Err(arg.wrong_type(format!("dtype {}; expected {}", self.dtype.name(), either(allowed))));
        }
        Ok(())
    }

    /// It is contiguous.
    pub fn require_contiguous(&self, arg: Arg) -> Result<()> {
        if !self.is_contiguous() {
            return Err(arg.invalid(format!(
                "is not contiguous (shape {:?}, strides {:?}); call .contiguous() first",
                self.shape, self.strides
            )));
        }
        Ok(())
    }

    /// It starts on `align` bytes (or is empty).
    pub fn require_aligned(&self, arg: Arg, align: u64) -> Result<()> {
        if self.numel() > 0 && self.ptr % align != 0 {
            return Err(arg.invalid(format!("address {:#x} is not {align}-byte aligned", self.ptr)));
        }
        Ok(())
    }

    /// Its shape (a trailing size-1 dimension allowed) is `[rows, cols]`.
    fn matrix(&self, arg: Arg, expected: &str) -> Result<(usize, usize)> {
        match *self.shape.trimmed() {
            [r, c] => Ok((r as usize, c as usize)),
            _ => Err(arg.invalid(format!("shape {:?}; expected {expected}", self.shape))),
        }
    }
}

/// One device per call: the ordinal of the first tensor that names one, and the error for a
/// tensor on another.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SameDevice {
    device: Option<u32>,
}

impl SameDevice {
    /// A call that runs on `device` (`None`: the first tensor's).
    pub fn new(device: Option<u32>) -> SameDevice {
        SameDevice { device }
    }

    /// `t` is on the call's device.
    pub fn check(&mut self, t: &TensorDesc, arg: Arg) -> Result<()> {
        match (t.device, self.device) {
            (None, _) => Ok(()),
            (Some(d), None) => {
                self.device = Some(d);
                Ok(())
            }
            (Some(d), Some(call)) if d == call => Ok(()),
            (Some(d), Some(call)) => Err(arg.invalid(format!("is on cuda:{d} but the call runs on cuda:{call}"))),
        }
    }

    /// The call's device (`None`: no tensor named one).
    pub fn device(&self) -> Option<u32> {
        self.device
    }
}

/// A float in words (`nan`, `inf`, `-inf` as C and Python print them).
pub fn float_words(x: f64) -> String {
    if x.is_nan() {
        "nan".into()
    } else if x.is_infinite() {
        if x > 0.0 { "inf" } else { "-inf" }.into()
    } else {
        format!("{x}")
    }
}

/// Every host alpha finite (`alphas[g]` of group `g`).
pub fn check_alphas(call: &'static str, name: &'static str, alphas: &[f32]) -> Result<()> {
    for (g, &a) in alphas.iter().enumerate() {
        if !a.is_finite() {
            return Err(Arg::group(call, g, name).invalid(format!("{} is not finite", float_words(a as f64))));
        }
    }
    Ok(())
}

/// A global scale: finite and positive.
pub fn check_global_scale(call: &'static str, name: &'static str, g: f64) -> Result<f32> {
    if !(g > 0.0 && g.is_finite()) {
        return Err(Arg::of(call, name).invalid(format!("{} is not finite and positive", float_words(g))));
    }
    Ok(g as f32)
}

/// Packed e2m1 values `[rows, K/2]` (a trailing size-1 dimension allowed), contiguous and
/// aligned: `(rows, K)`. `rows` and `k`, where given, are what the tensor must have (`k`: the K of
/// the group's other operand).
pub fn values(t: &TensorDesc, arg: Arg, rows: Option<usize>, k: Option<usize>) -> Result<(usize, usize)> {
    t.require_dtype(arg, VALUES)?;
    let (r, half) = t.matrix(arg, "[rows, K/2]")?;
    t.require_contiguous(arg)?;
    let kk = 2 * half;
    if let Some(rows) = rows {
        if r != rows {
            return Err(arg.invalid(format!("has {r} rows; expected {rows}")));
        }
    }
    if let Some(k) = k {
        if kk != k {
            return Err(arg.invalid(format!("K = 2·{half} = {kk} differs from A's K = {k}")));
        }
    }
    if !rules::k_is_valid(kk) {
        return Err(arg.invalid(format!("K = 2·{half} = {kk} is not a positive multiple of {}", rules::K_MULTIPLE)));
    }
    t.require_aligned(arg, rules::BUFFER_ALIGN)?;
    Ok((r, kk))
}

/// Weights `[n, K/2]`: [`values`], and `n` a multiple of [`rules::N_MULTIPLE`].
pub fn weights(t: &TensorDesc, arg: Arg, k: Option<usize>) -> Result<(usize, usize)> {
    let (n, k) = values(t, arg, None, k)?;
    if n % rules::N_MULTIPLE != 0 {
        return Err(arg.invalid(format!("N = {n} rows is not a multiple of {}", rules::N_MULTIPLE)));
    }
    Ok((n, k))
}

/// The strides (elements) of the permuted view `(32, 4, rest_m, 4, rest_k)` of blocked scales of
/// `rows × k` that the GPU MODE task hands out.
pub fn blocked_view_strides(rows: usize, k: usize) -> [i64; 5] {
    let rest_k = k.div_ceil(64) as i64;
    let _ = rows;
    [16, 4, rest_k * 512, 1, 512]
}

/// The blocked scales of a `rows × k` operand: a contiguous tensor of exactly
/// [`rules::blocked_bytes`] bytes (any shape), or the task's permuted view of them; aligned.
pub fn blocked_scales(t: &TensorDesc, arg: Arg, rows: usize, k: usize) -> Result<BufferView> {
    t.require_dtype(arg, SCALES)?;
    let want = rules::blocked_bytes(rows, k);
    if t.is_contiguous() {
        if t.numel() != want {
            let hint = if t.shape.get() == [rows as i64, (k / 16) as i64] {
                " (this is the plain [rows, K/16] layout: pass scale_layout='plain')"
            } else {
                ""
            };
            return Err(arg.invalid(format!(
                "has {} bytes (shape {:?}); {rows} rows × K={k} need exactly {want} in the 128x4 blocked layout{hint}",
                t.numel(),
                t.shape
            )));
        }
        t.require_aligned(arg, rules::BUFFER_ALIGN)?;
        return Ok(BufferView { ptr: t.ptr, len: want });
    }
    let (rest_m, rest_k) = (rows.div_ceil(128) as i64, k.div_ceil(64) as i64);
    let shape5 = [32, 4, rest_m, 4, rest_k];
    let strides = blocked_view_strides(rows, k);
    let shape = t.shape.get();
    let view = shape.len() >= 5
        && shape[..5] == shape5
        && (shape.len() == 5 || shape[5..] == [1])
        && shape.iter().zip(t.strides.get()).zip(strides).all(|((&d, &s), w)| d == 1 || s == w);
    if view {
        t.require_aligned(arg, rules::BUFFER_ALIGN)?;
        return Ok(BufferView { ptr: t.ptr, len: want });
    }
    Err(arg.invalid(format!(
        "shape {:?} with strides {:?} is neither contiguous blocked scales ({want} bytes) nor the blocked \
         layout's view of shape {shape5:?} (+1) with strides {strides:?}",
        t.shape, t.strides
    )))
}

/// Plain scales `[rows, K/16]` of a `rows × k` operand (before a conversion to the blocked layout).
pub fn plain_scales(t: &TensorDesc, arg: Arg, rows: usize, k: usize) -> Result<()> {
    t.require_dtype(arg, SCALES)?;
    if t.shape.trimmed() != [rows as i64, (k / 16) as i64] {
        return Err(arg.invalid(format!(
            "shape {:?}; plain scales of {rows} rows × K={k} are [{rows}, {}]",
            t.shape,
            k / 16
        )));
    }
    Ok(())
}

/// An output `[rows, cols]` of type `dtype` (a trailing size-1 dimension allowed), contiguous and
/// aligned.
pub fn output(t: &TensorDesc, arg: Arg, rows: usize, cols: usize, dtype: DType) -> Result<BufferView> {
    t.require_dtype(arg, &[dtype])?;
    if t.shape.trimmed() != [rows as i64, cols as i64] {
        return Err(arg.invalid(format!("shape {:?}; expected [{rows}, {cols}]", t.shape)));
    }
    t.require_contiguous(arg)?;
    t.require_aligned(arg, rules::BUFFER_ALIGN)?;
    Ok(t.view())
}

/// A tensor of exactly `shape`, type `dtype`, contiguous and aligned (`what` says what the shape
/// is, for the error).
pub fn exact(t: &TensorDesc, arg: Arg, dtypes: &[DType], shape: &[usize], what: &str) -> Result<BufferView> {
    t.require_dtype(arg, dtypes)?;
    if t.shape.get().iter().map(|&d| d as usize).ne(shape.iter().copied()) {
        return Err(arg.invalid(format!("shape {:?}; {what} {:?}", t.shape, shape)));
    }
    t.require_contiguous(arg)?;
    t.require_aligned(arg, rules::BUFFER_ALIGN)?;
    Ok(t.view())
}

/// A contiguous buffer of exactly `bytes` bytes (any shape) of one of `dtypes`, aligned (`what`:
/// what those bytes are, for the error).
pub fn bytes(t: &TensorDesc, arg: Arg, dtypes: &[DType], bytes: usize, what: &str) -> Result<BufferView> {
    t.require_dtype(arg, dtypes)?;
    t.require_contiguous(arg)?;
    if t.nbytes() != bytes {
        return Err(arg.invalid(format!("has {} bytes; {what} {bytes}", t.nbytes())));
    }
    t.require_aligned(arg, rules::BUFFER_ALIGN)?;
    Ok(BufferView { ptr: t.ptr, len: bytes })
}

/// Device alphas: a CUDA `float32` tensor `[groups]`, contiguous, 4-byte aligned.
pub fn device_alphas(t: &TensorDesc, arg: Arg, groups: usize) -> Result<BufferView> {
    t.require_dtype(arg, &[DType::F32])?;
    if t.shape.get() != [groups as i64] {
        return Err(arg.invalid(format!("shape {:?}; expected [{groups}] (one float32 per group)", t.shape)));
    }
    t.require_contiguous(arg)?;
    t.require_aligned(arg, 4)?;
    Ok(t.view())
}

/// The output type of a call: `requested` (a type name), else `default`; a 16-bit float type.
pub fn output_type(call: &'static str, requested: Option<DType>, default: DType) -> Result<OutputType> {
    let t = requested.unwrap_or(default);
    t.output()
        .ok_or_else(|| Arg::of(call, "out_dtype").wrong_type(format!("{}; expected float16 or bfloat16", t.name())))
}

/// Dense 16-bit floats `[rows, K]` (a quantizer's input), contiguous and aligned: `(rows, K)`.
pub fn dense(t: &TensorDesc, arg: Arg) -> Result<(usize, usize)> {
    t.require_dtype(arg, DENSE)?;
    let [rows, k] = *t.shape.get() else {
        return Err(arg.invalid(format!("shape {:?}; expected [rows, K]", t.shape)));
    };
    t.require_contiguous(arg)?;
    t.require_aligned(arg, rules::BUFFER_ALIGN)?;
    let (rows, k) = (rows as usize, k as usize);
    if !rules::k_is_valid(k) {
        return Err(arg.invalid(format!("K = {k} is not a positive multiple of {}", rules::K_MULTIPLE)));
    }
    Ok((rows, k))
}

/// The NVFP4 tensors a quantizer writes for `rows × k`: values `[rows, K/2]`, contiguous blocked
/// scales.
pub fn nvfp4_output(
    values_t: &TensorDesc,
    scales_t: &TensorDesc,
    call: &'static str,
    rows: usize,
    k: usize,
) -> Result<(BufferView, BufferView)> {
    values(values_t, Arg::of(call, "values"), Some(rows), Some(k))?;
    let scales = blocked_scales(scales_t, Arg::of(call, "scales"), rows, k)?;
    if !scales_t.is_contiguous() {
        return Err(Arg::of(call, "scales").invalid("must be contiguous to be written"));
    }
    Ok((values_t.view_bytes(), scales))
}

/// A mixture-of-experts layer's weights `[E, N, K/2]`, contiguous and aligned: `(E, N, K)`.
pub fn experts(t: &TensorDesc, arg: Arg) -> Result<(usize, usize, usize)> {
    t.require_dtype(arg, VALUES)?;
    let [e, n, half] = *t.shape.get() else {
        return Err(arg.invalid(format!("shape {:?}; expected [E, N, K/2]", t.shape)));
    };
    t.require_contiguous(arg)?;
    t.require_aligned(arg, rules::BUFFER_ALIGN)?;
    let (e, n, k) = (e as usize, n as usize, 2 * half as usize);
    if !rules::k_is_valid(k) {
        return Err(arg.invalid(format!("K = 2·{half} = {k} is not a positive multiple of {}", rules::K_MULTIPLE)));
    }
    if !rules::n_is_valid(n) {
        return Err(arg.invalid(format!("N = {n} is not a positive multiple of {}", rules::N_MULTIPLE)));
    }
    Ok((e, n, k))
}

/// Every expert's plain scales `[E, N, K/16]` (before a conversion to the blocked layout).
pub fn expert_plain_scales(t: &TensorDesc, arg: Arg, experts: usize, n: usize, k: usize) -> Result<()> {
    t.require_dtype(arg, SCALES)?;
    if t.shape.get() != [experts as i64, n as i64, (k / 16) as i64] {
        return Err(arg.invalid(format!("shape {:?}; plain scales are [{experts}, {n}, {}]", t.shape, k / 16)));
    }
    Ok(())
}

/// Every expert's blocked scales back to back (any contiguous shape), aligned.
pub fn expert_scales(t: &TensorDesc, arg: Arg, experts: usize, n: usize, k: usize) -> Result<BufferView> {
    let want = experts * rules::blocked_bytes(n, k);
    bytes(t, arg, SCALES, want, &format!("{experts} experts of N={n}, K={k} need (blocked)"))
}

/// Device-resident group sizes: `int32`/`uint32` `[len]`, contiguous, 4-byte aligned (`what`:
/// what the layout takes, for the error).
pub fn sizes(t: &TensorDesc, arg: Arg, len: usize, what: &str) -> Result<BufferView> {
    t.require_dtype(arg, SIZES)?;
    if t.shape.get() != [len as i64] {
        return Err(arg.invalid(format!("shape {:?}; {what} [{len}]", t.shape)));
    }
    t.require_contiguous(arg)?;
    t.require_aligned(arg, 4)?;
    Ok(t.view())
}

/// One group's operands of a grouped GEMM call as described: A (NVFP4: values and scales; W4A16:
/// the activations) and B's values and scales.
#[derive(Debug, Clone, Copy)]
pub struct GroupTensors<'a> {
    /// A's values (NVFP4) or the activations (W4A16).
    pub a: &'a TensorDesc,
    /// A's blocked scales (NVFP4 only).
    pub a_scales: Option<&'a TensorDesc>,
    /// B's packed values.
    pub b: &'a TensorDesc,
    /// B's blocked scales.
    pub b_scales: &'a TensorDesc,
}

/// The names a call gives its per-group lists.
#[derive(Debug, Clone, Copy)]
pub struct GroupNames {
    /// The call.
    pub call: &'static str,
    /// A (values, or the activations).
    pub a: &'static str,
    /// A's scales.
    pub a_scales: &'static str,
    /// B.
    pub b: &'static str,
    /// B's scales.
    pub b_scales: &'static str,
}

/// What a grouped GEMM call's inputs say, checked: each group's shape, the token operand, and the
/// views of A (values, scales) and B (values, scales).
#[derive(Debug, Clone, Default)]
pub struct GroupInputs {
    /// The groups' shapes.
    pub shapes: Vec<GroupShape>,
    /// The token operand.
    pub tokens: TokenKind,
    /// Each group's A values (or activations), A scales (empty for activations), B values, B
    /// scales.
    pub views: Vec<[BufferView; 4]>,
}

/// Checks one group's operands (`g`, named by `names`) and appends its shape and views to `out`.
/// A is NVFP4 when `a_scales` is given, else 16-bit activations `[m, K]` of the type of group 0's
/// (the call's token operand); W4A16's B scales are contiguous blocked bytes (prepacked).
pub fn group_inputs(
    g: usize,
    t: &GroupTensors<'_>,
    names: &GroupNames,
    device: &mut SameDevice,
    out: &mut GroupInputs,
) -> Result<()> {
    let arg = |name| Arg::group(names.call, g, name);
    let (m, k, a_view, a_scales_view) = match t.a_scales {
        Some(a_scales) => {
            let (m, k) = values(t.a, arg(names.a), None, None)?;
            let s = blocked_scales(a_scales, arg(names.a_scales), m, k)?;
            (m, k, t.a.view_bytes(), s)
        }
        None => {
            out.tokens = activations(t.a, arg(names.a), (g > 0).then_some(out.tokens))?;
            let [m, k] = *t.a.shape.get() else {
                return Err(arg(names.a).invalid(format!("shape {:?}; expected [m, K]", t.a.shape)));
            };
            t.a.require_contiguous(arg(names.a))?;
            t.a.require_aligned(arg(names.a), rules::BUFFER_ALIGN)?;
            (m as usize, k as usize, t.a.view(), BufferView { ptr: 0, len: 0 })
        }
    };
    let (n, _) = weights(t.b, arg(names.b), Some(k))?;
    let b_scales = match t.a_scales {
        Some(_) => blocked_scales(t.b_scales, arg(names.b_scales), n, k)?,
        None => {
            let want = rules::blocked_bytes(n, k);
            bytes(t.b_scales, arg(names.b_scales), SCALES, want, &format!("N={n}, K={k} needs (blocked)"))?
        }
    };
    device.check(t.a, arg(names.a))?;
    if let Some(s) = t.a_scales {
        device.check(s, arg(names.a_scales))?;
    }
    device.check(t.b, arg(names.b))?;
    device.check(t.b_scales, arg(names.b_scales))?;
    out.shapes.push(GroupShape::new(m, n, k));
    out.views.push([a_view, a_scales_view, t.b.view_bytes(), b_scales]);
    Ok(())
}

/// The token kind of activations `t` (16-bit floats), the same as `same` where given.
fn activations(t: &TensorDesc, arg: Arg, same: Option<TokenKind>) -> Result<TokenKind> {
    let Some(kind) = t.dtype.activations() else {
        return Err(arg.wrong_type(format!("{}; expected float16 or bfloat16", t.dtype.name())));
    };
    match same {
        Some(TokenKind::Dense(first)) if first != kind => {
            let first = if first == Activations::F16 { DType::F16 } else { DType::Bf16 };
            Err(arg.wrong_type(format!(
                "{}; group 0's activations are {} (one type per call)",
                t.dtype.name(),
                first.name()
            )))
        }
        _ => Ok(TokenKind::Dense(kind)),
    }
}

/// The operands of a stacked grouped GEMM call: A's values `[T, K/2]` (tokens sorted by group)
/// and blocked scales (every group's back to back), B's values `[G, N, K/2]` and blocked scales.
#[derive(Debug, Clone, Copy)]
pub struct StackedTensors<'a> {
    /// A's values.
    pub a: &'a TensorDesc,
    /// A's scales.
    pub a_scales: &'a TensorDesc,
    /// B's values.
    pub b: &'a TensorDesc,
    /// B's scales.
    pub b_scales: &'a TensorDesc,
}

/// What a stacked call's inputs say, checked.
#[derive(Debug, Clone)]
pub struct StackedInputs {
    /// The groups' shapes (`m` from `m_sizes`).
    pub shapes: Vec<GroupShape>,
    /// N (every group's).
    pub n: usize,
    /// A's values, A's scales, B's values, B's scales.
    pub views: [BufferView; 4],
}

/// Checks a stacked call's operands for the group sizes `m_sizes` (as many as B's groups).
pub fn stacked_inputs(
    call: &'static str,
    t: &StackedTensors<'_>,
    m_sizes: &[usize],
    device: &mut SameDevice,
) -> Result<StackedInputs> {
    let arg = |name| Arg::of(call, name);
    t.b.require_dtype(arg("b"), VALUES)?;
    let [groups, n, half] = *t.b.shape.get() else {
        return Err(arg("b").invalid(format!("shape {:?}; expected [G, N, K/2]", t.b.shape)));
    };
    let (groups, n, k) = (groups as usize, n as usize, 2 * half as usize);
    if m_sizes.len() != groups {
        return Err(arg("m_sizes").invalid(format!("{} sizes but `b` has {groups} groups", m_sizes.len())));
    }
    t.b.require_contiguous(arg("b"))?;
    t.b.require_aligned(arg("b"), rules::BUFFER_ALIGN)?;
    if !rules::k_is_valid(k) {
        return Err(arg("b").invalid(format!("K = 2·{half} = {k} is not a positive multiple of {}", rules::K_MULTIPLE)));
    }
    if !rules::n_is_valid(n) {
        return Err(arg("b").invalid(format!("N = {n} is not a multiple of {}", rules::N_MULTIPLE)));
    }
    let tokens: usize = m_sizes.iter().sum();
    values(t.a, arg("a"), Some(tokens), Some(k))?;
    let a_scales: usize = m_sizes.iter().map(|&m| rules::blocked_bytes(m, k)).sum();
    let what = "the stacked groups' blocked scales are";
    let a_scales = bytes(t.a_scales, arg("a_scales"), SCALES, a_scales, what)?;
    let b_scales = bytes(t.b_scales, arg("b_scales"), SCALES, groups * rules::blocked_bytes(n, k), what)?;
    for (d, name) in [(t.a, "a"), (t.b, "b"), (t.a_scales, "a_scales"), (t.b_scales, "b_scales")] {
        device.check(d, arg(name))?;
    }
    Ok(StackedInputs {
        shapes: m_sizes.iter().map(|&m| GroupShape::new(m, n, k)).collect(),
        n,
        views: [t.a.view_bytes(), a_scales, t.b.view_bytes(), b_scales],
    })
}

impl TensorDesc {
    /// Its bytes as a buffer view (address, length in bytes).
    pub fn view_bytes(&self) -> BufferView {
        BufferView { ptr: self.ptr, len: self.nbytes() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(shape: &[i64], dtype: DType) -> TensorDesc {
        let mut strides = vec![0i64; shape.len()];
        let mut acc = 1;
        for i in (0..shape.len()).rev() {
            strides[i] = acc;
            acc *= shape[i];
        }
        TensorDesc {
            ptr: 0x7f00_0000_0000,
            shape: Dims::new(shape).unwrap(),
            strides: Dims::new(&strides).unwrap(),
            dtype,
            device: Some(0),
        }
    }

    #[test]
    fn names_and_sizes_of_types() {
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()), d);
            assert_eq!(DType::from_name(&format!("torch.{}", d.name())), d);
            assert!(d.bytes() > 0);
        }
        assert_eq!(DType::from_name("complex64"), DType::Other);
    }

    #[test]
    fn contiguity_ignores_unit_dimensions() {
        assert!(t(&[96, 128], DType::U8).is_contiguous());
        let mut x = t(&[96, 128, 1], DType::U8);
        x.strides = Dims::new(&[128, 1, 7]).unwrap();
        assert!(x.is_contiguous());
        x.strides = Dims::new(&[256, 1, 1]).unwrap();
        assert!(!x.is_contiguous());
    }

    #[test]
    fn messages_name_the_argument() {
        let arg = Arg::group("grouped_gemm", 1, "a");
        let e = values(&t(&[96, 48], DType::U8), arg, None, None).unwrap_err();
        assert_eq!(e.to_string(), "group 1: `a`: K = 2·48 = 96 is not a positive multiple of 64");
        let e = values(&t(&[96, 128], DType::F16), arg, None, None).unwrap_err();
        assert!(matches!(e, Error::WrongType { .. }));
        assert_eq!(e.to_string(), "group 1: `a`: dtype float16; expected uint8 or float4_e2m1fn_x2");
        let e = weights(&t(&[100, 128], DType::U8), Arg::group("grouped_gemm", 1, "b"), None).unwrap_err();
        assert_eq!(e.to_string(), "group 1: `b`: N = 100 rows is not a multiple of 8");
        let e = device_alphas(&t(&[3], DType::F32), Arg::of("grouped_gemm", "alpha"), 2).unwrap_err();
        assert_eq!(e.to_string(), "grouped_gemm: `alpha`: shape [3]; expected [2] (one float32 per group)");
        assert_eq!(float_words(f64::NAN), "nan");
        assert_eq!(
            check_alphas("c", "alpha", &[1.0, f32::INFINITY]).unwrap_err().to_string(),
            "group 1: `alpha`: inf is not finite"
        );
    }
}
