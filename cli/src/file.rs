//! The safetensors files the tool reads and writes. Parsing and validation are pure functions of
//! the file's bytes (no GPU, no panics on bad input), so every error path is tested on the CPU.
//!
//! # Input: the groups
//!
//! For each group `i = 0, 1, …, G-1` (numbered without gaps):
//!
//! | tensor         | dtype                        | shape                                        |
//! |----------------|------------------------------|----------------------------------------------|
//! | `g{i}.a`       | `U8` (torch `uint8`)         | `[m, k/2]`: packed e2m1, element `2j` in the low nibble of byte `j` |
//! |                | or `F4` (`float4_e2m1fn_x2`) | `[m, k]`                                     |
//! | `g{i}.a_scale` | `F8_E4M3` (torch `float8_e4m3fn`) or `U8` (raw codes) | `[m, k/16]` plain row-major, or 1-D `[ceil(m/128)·128 · ceil(k/64)·4]` in the 128x4 blocked layout |
//! | `g{i}.b`       | as `g{i}.a`                  | `[n, k/2]` (`F4`: `[n, k]`)                  |
//! | `g{i}.b_scale` | as `g{i}.a_scale`            | `[n, k/16]` or 1-D blocked                   |
//! | `g{i}.alpha`   | `F32`, optional (1.0)        | `[]` or `[1]`                                |
//!
//! The layout of a scale tensor is told by its rank: 2-D is plain, 1-D is blocked. Rules: k a
//! positive multiple of 64 and the same for A and B; n a positive multiple of 8; m ≥ 0 (an empty
//! group is skipped); alpha finite. Tensors `g{i}.c` are ignored, so one file may hold both the
//! inputs and the output; any other name is an error.
//!
//! # Output: C
//!
//! `g{i}.c`, `F16` (or `BF16` with `run --bf16`), shape `[m, n]`, row-major:
//! `C_i = alpha_i · A_i · B_iᵀ`. Other tensors in an output file are ignored when it is read.

use crate::error::CliError;
use half::{bf16, f16};
use nvfp4_format::{layout, Group, GroupShape, Nvfp4Matrix};
use nvfp4_gemm::{OutputType, Problem};
use safetensors::{Dtype, SafeTensorError, SafeTensors};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// Value of the `format` entry in the metadata of the files this tool writes.
pub const FORMAT: &str = "nvfp4-grouped-gemm";

/// How a scale tensor was stored in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScaleLayout {
    /// `[rows, k/16]` row-major.
    Plain,
    /// 1-D, 128x4 blocked (what the device consumes).
    Blocked,
}

/// The groups of an input file.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupsFile {
    /// The groups (global scales 1, alpha from `g{i}.alpha`).
    pub groups: Vec<Group>,
    /// How A's and B's scales were stored, per group.
    pub scale_layouts: Vec<(ScaleLayout, ScaleLayout)>,
}

impl GroupsFile {
    /// The group shapes.
    pub fn shapes(&self) -> Vec<GroupShape> {
        self.groups.iter().map(|g| GroupShape::new(g.m(), g.n(), g.k())).collect()
    }
}

/// The output of a grouped GEMM, one row-major buffer per group.
#[derive(Debug, Clone, PartialEq)]
pub enum Outputs {
    /// fp16.
    F16(Vec<Vec<f16>>),
    /// bf16.
    Bf16(Vec<Vec<bf16>>),
}

impl Outputs {
    /// The element type.
    pub fn output_type(&self) -> OutputType {
        match self {
            Outputs::F16(_) => OutputType::F16,
            Outputs::Bf16(_) => OutputType::Bf16,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Field {
    A,
    AScale,
    B,
    BScale,
    Alpha,
    C,
}

const FIELDS: [(&str, Field); 6] = [
    ("a", Field::A),
    ("a_scale", Field::AScale),
    ("b", Field::B),
    ("b_scale", Field::BScale),
    ("alpha", Field::Alpha),
    ("c", Field::C),
];

const NAME_RULE: &str = "names are g{i}.a, g{i}.a_scale, g{i}.b, g{i}.b_scale, g{i}.alpha (optional) and g{i}.c \
                         (ignored on input), with i = 0, 1, ... written without leading zeros";

/// Splits `g12.a_scale` into (12, AScale).
fn parse_name(name: &str) -> Result<(usize, Field), CliError> {
    let bad = || CliError::UnexpectedTensor { name: name.to_owned(), reason: NAME_RULE.to_owned() };
    let rest = name.strip_prefix('g').ok_or_else(bad)?;
    let (index, field) = rest.split_once('.').ok_or_else(bad)?;
    if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) || (index.len() > 1 && index.starts_with('0')) {
        return Err(bad());
    }
    let index: usize = index.parse().map_err(|_| bad())?;
    if index >= nvfp4_gemm::problem::MAX_GROUPS {
        return Err(CliError::UnexpectedTensor {
            name: name.to_owned(),
            reason: format!("at most {} groups are supported", nvfp4_gemm::problem::MAX_GROUPS),
        });
    }
    let field = FIELDS.iter().find(|(n, _)| *n == field).map(|(_, f)| *f).ok_or_else(bad)?;
    Ok((index, field))
}

/// Reads a whole file.
pub fn read_file(path: &Path) -> Result<Vec<u8>, CliError> {
    std::fs::read(path).map_err(|error| CliError::Io { path: path.to_owned(), error })
}

fn deserialize(bytes: &[u8]) -> Result<SafeTensors<'_>, CliError> {
    SafeTensors::deserialize(bytes).map_err(|e| match e {
        SafeTensorError::MetadataIncompleteBuffer => match declared_len(bytes) {
            Some(declared) => CliError::Length { declared, actual: bytes.len() },
            None => CliError::NotSafetensors(e.to_string()),
        },
        e => CliError::NotSafetensors(e.to_string()),
    })
}

/// The file length a safetensors header declares: 8 bytes of header length, the header, and the
/// tensor data up to the largest end offset. `None` when the header itself does not parse.
fn declared_len(bytes: &[u8]) -> Option<usize> {
    let n = usize::try_from(u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?)).ok()?;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(bytes.get(8..8usize.checked_add(n)?)?).ok()?;
    let data_end = header
        .iter()
        .filter(|(name, _)| *name != "__metadata__")
        .filter_map(|(_, t)| t.get("data_offsets")?.get(1)?.as_u64())
        .max()
        .unwrap_or(0);
    (8 + n).checked_add(usize::try_from(data_end).ok()?)
}

const VALUES_DTYPES: &str = "U8 (torch.uint8, two e2m1 values per byte) or F4 (torch.float4_e2m1fn_x2)";
const SCALE_DTYPES: &str = "F8_E4M3 (torch.float8_e4m3fn) or U8 (raw e4m3 codes)";

/// Reads a packed-values tensor: returns (rows, k, bytes).
fn values_tensor(name: &str, t: &safetensors::tensor::TensorView<'_>) -> Result<(usize, usize, Vec<u8>), CliError> {
    let shape = t.shape();
    let (rows, k) = match t.dtype() {
        Dtype::U8 if shape.len() == 2 => (shape[0], shape[1].checked_mul(2)),
        Dtype::F4 if shape.len() == 2 => (shape[0], Some(shape[1])),
        Dtype::U8 | Dtype::F4 => {
            return Err(CliError::WrongShape {
                name: name.to_owned(),
                got: shape.to_vec(),
                expected: "2-D: [rows, k/2] for U8, [rows, k] for F4".into(),
            })
        }
        other => {
            return Err(CliError::WrongDtype {
                name: name.to_owned(),
                got: other.to_string(),
                expected: VALUES_DTYPES.into(),
            })
        }
    };
    let k = k.ok_or_else(|| CliError::Invalid { name: name.to_owned(), reason: "k is too large".into() })?;
    if !nvfp4_gemm::rules::k_is_valid(k) {
        return Err(CliError::Invalid {
            name: name.to_owned(),
            reason: format!(
                "k = {k} values per row; the grouped GEMM needs k to be a positive multiple of {}",
                nvfp4_gemm::rules::K_MULTIPLE
            ),
        });
    }
    let bytes = t.data();
    if bytes.len() != rows * (k / 2) {
        // safetensors checks offsets against dtype and shape; this guards the F4 case regardless.
        return Err(CliError::Invalid {
            name: name.to_owned(),
            reason: format!("holds {} bytes; [{rows} rows, k = {k}] needs {}", bytes.len(), rows * (k / 2)),
        });
    }
    Ok((rows, k, bytes.to_vec()))
}

fn scale_expectation(rows: usize, k: usize) -> String {
    let blocked = layout::blocked_len(rows, k).map(|b| b.to_string()).unwrap_or_else(|_| "?".into());
    format!("[{rows}, {}] (plain) or [{blocked}] (128x4 blocked); dtype {SCALE_DTYPES}", k / 16)
}

/// Reads a scale tensor for a `rows x k` operand: returns BLOCKED scales and the layout found.
fn scales_tensor(
    name: &str,
    t: &safetensors::tensor::TensorView<'_>,
    rows: usize,
    k: usize,
) -> Result<(Vec<u8>, ScaleLayout), CliError> {
    if !matches!(t.dtype(), Dtype::F8_E4M3 | Dtype::U8) {
        return Err(CliError::WrongDtype {
            name: name.to_owned(),
            got: t.dtype().to_string(),
            expected: SCALE_DTYPES.into(),
        });
    }
    let invalid = |e: nvfp4_format::FormatError| CliError::Invalid { name: name.to_owned(), reason: e.to_string() };
    let shape = t.shape();
    let blocked_len = layout::blocked_len(rows, k).map_err(invalid)?;
    if shape.len() == 2 && shape[0] == rows && shape[1] == k / 16 {
        Ok((layout::plain_to_blocked(t.data(), rows, k).map_err(invalid)?, ScaleLayout::Plain))
    } else if shape.len() == 1 && shape[0] == blocked_len {
        Ok((t.data().to_vec(), ScaleLayout::Blocked))
    } else {
        Err(CliError::WrongShape { name: name.to_owned(), got: shape.to_vec(), expected: scale_expectation(rows, k) })
    }
}

fn alpha_tensor(name: &str, t: &safetensors::tensor::TensorView<'_>) -> Result<f32, CliError> {
    if t.dtype() != Dtype::F32 {
        return Err(CliError::WrongDtype { name: name.to_owned(), got: t.dtype().to_string(), expected: "F32".into() });
    }
    if !(t.shape().is_empty() || t.shape() == [1]) {
        return Err(CliError::WrongShape {
            name: name.to_owned(),
            got: t.shape().to_vec(),
            expected: "a scalar: [] or [1]".into(),
        });
    }
    let bytes: [u8; 4] = t.data().try_into().map_err(|_| CliError::Invalid {
        name: name.to_owned(),
        reason: format!("holds {} bytes, not 4", t.data().len()),
    })?;
    let alpha = f32::from_le_bytes(bytes);
    if !alpha.is_finite() {
        return Err(CliError::Invalid { name: name.to_owned(), reason: format!("alpha = {alpha} is not finite") });
    }
    Ok(alpha)
}

/// Parses and validates an input file's bytes (module docs for the format).
pub fn parse_groups(bytes: &[u8]) -> Result<GroupsFile, CliError> {
    let st = deserialize(bytes)?;
    let mut by_group: BTreeMap<usize, HashMap<Field, safetensors::tensor::TensorView<'_>>> = BTreeMap::new();
    for (name, view) in st.iter() {
        let (index, field) = parse_name(name)?;
        if field == Field::C {
            continue;
        }
        by_group.entry(index).or_default().insert(field, view);
    }
    let Some(&last) = by_group.keys().next_back() else {
        return Err(CliError::NoGroups);
    };
    let mut groups = Vec::with_capacity(last + 1);
    let mut scale_layouts = Vec::with_capacity(last + 1);
    let empty = HashMap::new();
    for i in 0..=last {
        let tensors = by_group.get(&i).unwrap_or(&empty);
        let get = |field: Field, what: &str, expected: &str| {
            tensors
                .get(&field)
                .ok_or_else(|| CliError::MissingTensor { name: format!("g{i}.{what}"), expected: expected.to_owned() })
        };
        let a_name = format!("g{i}.a");
        let b_name = format!("g{i}.b");
        let (m, k, a_values) = values_tensor(&a_name, get(Field::A, "a", &format!("[m, k/2] {VALUES_DTYPES}"))?)?;
        let (n, kb, b_values) =
            values_tensor(&b_name, get(Field::B, "b", &format!("[n, {}] {VALUES_DTYPES}", k / 2))?)?;
        if kb != k {
            return Err(CliError::Invalid {
                name: b_name,
                reason: format!("has k = {kb} values per row but `g{i}.a` has k = {k}; A and B must share k"),
            });
        }
        if !nvfp4_gemm::rules::n_is_valid(n) {
            return Err(CliError::Invalid {
                name: b_name,
                reason: format!(
                    "n = {n} rows; the grouped GEMM needs n to be a positive multiple of {}",
                    nvfp4_gemm::rules::N_MULTIPLE
                ),
            });
        }
        let a_scale_name = format!("g{i}.a_scale");
        let b_scale_name = format!("g{i}.b_scale");
        let (a_scales, a_layout) =
            scales_tensor(&a_scale_name, get(Field::AScale, "a_scale", &scale_expectation(m, k))?, m, k)?;
        let (b_scales, b_layout) =
            scales_tensor(&b_scale_name, get(Field::BScale, "b_scale", &scale_expectation(n, k))?, n, k)?;
        let alpha = match tensors.get(&Field::Alpha) {
            Some(t) => alpha_tensor(&format!("g{i}.alpha"), t)?,
            None => 1.0,
        };
        let invalid = |name: &str, e: nvfp4_format::FormatError| CliError::Invalid {
            name: name.to_owned(),
            reason: e.to_string(),
        };
        let a = Nvfp4Matrix::new(m, k, a_values, a_scales, 1.0).map_err(|e| invalid(&a_name, e))?;
        let b = Nvfp4Matrix::new(n, k, b_values, b_scales, 1.0).map_err(|e| invalid(&b_name, e))?;
        groups.push(Group::new(a, b, alpha).map_err(|e| invalid(&format!("g{i}"), e))?);
        scale_layouts.push((a_layout, b_layout));
    }
    let file = GroupsFile { groups, scale_layouts };
    // The library's own rules (sizes, group count), so that `run` cannot fail on a file that parsed.
    Problem::new(file.shapes(), OutputType::F16)
        .map_err(|e| CliError::Invalid { name: "groups".into(), reason: e.to_string() })?;
    Ok(file)
}

/// Reads and validates an input file.
pub fn read_groups(path: &Path) -> Result<GroupsFile, CliError> {
    let bytes = read_file(path)?;
    parse_groups(&bytes).map_err(|e| e.in_file(path))
}

fn decode_16<T>(bytes: &[u8], from_bits: fn(u16) -> T) -> Vec<T> {
    bytes.chunks_exact(2).map(|b| from_bits(u16::from_le_bytes([b[0], b[1]]))).collect()
}

/// Parses an output file's bytes against the input's shapes.
pub fn parse_outputs(bytes: &[u8], shapes: &[GroupShape]) -> Result<Outputs, CliError> {
    let st = deserialize(bytes)?;
    for name in st.names() {
        if let Ok((index, Field::C)) = parse_name(name) {
            if index >= shapes.len() {
                return Err(CliError::UnexpectedTensor {
                    name: name.to_owned(),
                    reason: format!("the input has {}", crate::commands::plural(shapes.len(), "group")),
                });
            }
        }
    }
    let mut f16_out = vec![];
    let mut bf16_out = vec![];
    let mut dtype: Option<Dtype> = None;
    for (i, s) in shapes.iter().enumerate() {
        let name = format!("g{i}.c");
        let t = st.tensor(&name).map_err(|_| CliError::MissingTensor {
            name: name.clone(),
            expected: format!("F16 or BF16 [{}, {}]", s.m, s.n),
        })?;
        match (t.dtype(), dtype) {
            (Dtype::F16 | Dtype::BF16, None) => dtype = Some(t.dtype()),
            (d, Some(first)) if d == first => {}
            (d, first) => {
                return Err(CliError::WrongDtype {
                    name,
                    got: d.to_string(),
                    expected: match first {
                        Some(f) => format!("{f}, as g0.c"),
                        None => "F16 or BF16".into(),
                    },
                })
            }
        }
        if t.shape() != [s.m, s.n] {
            return Err(CliError::WrongShape {
                name,
                got: t.shape().to_vec(),
                expected: format!("[{}, {}] (m, n of group {i})", s.m, s.n),
            });
        }
        match t.dtype() {
            Dtype::F16 => f16_out.push(decode_16(t.data(), f16::from_bits)),
            _ => bf16_out.push(decode_16(t.data(), bf16::from_bits)),
        }
    }
    Ok(match dtype {
        Some(Dtype::BF16) => Outputs::Bf16(bf16_out),
        _ => Outputs::F16(f16_out),
    })
}

/// Reads an output file against the input's shapes.
pub fn read_outputs(path: &Path, shapes: &[GroupShape]) -> Result<Outputs, CliError> {
    let bytes = read_file(path)?;
    parse_outputs(&bytes, shapes).map_err(|e| e.in_file(path))
}

/// One tensor to write: name, dtype, shape, little-endian bytes.
struct Owned {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

fn serialize(tensors: &[Owned], content: &str) -> Result<Vec<u8>, CliError> {
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|t| {
            safetensors::tensor::TensorView::new(t.dtype, t.shape.clone(), &t.data)
                .map(|v| (t.name.clone(), v))
                .map_err(|e| CliError::Invalid { name: t.name.clone(), reason: e.to_string() })
        })
        .collect::<Result<_, _>>()?;
    let metadata =
        HashMap::from([("format".to_owned(), FORMAT.to_owned()), ("content".to_owned(), content.to_owned())]);
    safetensors::serialize(views, Some(metadata))
        .map_err(|e| CliError::Invalid { name: "file".into(), reason: e.to_string() })
}

fn write_bytes(path: &Path, bytes: &[u8]) -> Result<(), CliError> {
    std::fs::write(path, bytes).map_err(|error| CliError::Io { path: path.to_owned(), error })
}

/// The bytes of an output file.
pub fn serialize_outputs(outputs: &Outputs, shapes: &[GroupShape]) -> Result<Vec<u8>, CliError> {
    fn tensors<T: Copy>(c: &[Vec<T>], shapes: &[GroupShape], dtype: Dtype, bits: fn(T) -> u16) -> Vec<Owned> {
        c.iter()
            .zip(shapes)
            .enumerate()
            .map(|(i, (c, s))| Owned {
                name: format!("g{i}.c"),
                dtype,
                shape: vec![s.m, s.n],
                data: c.iter().flat_map(|&x| bits(x).to_le_bytes()).collect(),
            })
            .collect()
    }
    let tensors = match outputs {
        Outputs::F16(c) => tensors(c, shapes, Dtype::F16, f16::to_bits),
        Outputs::Bf16(c) => tensors(c, shapes, Dtype::BF16, bf16::to_bits),
    };
    serialize(&tensors, "output")
}

/// Writes an output file.
pub fn write_outputs(path: &Path, outputs: &Outputs, shapes: &[GroupShape]) -> Result<(), CliError> {
    write_bytes(path, &serialize_outputs(outputs, shapes)?)
}

/// The bytes of an input file holding `groups` (scales as F8_E4M3 in `layout`; alpha always
/// written; the global scales must be 1, as the format has none).
pub fn serialize_groups(groups: &[Group], layout: ScaleLayout) -> Result<Vec<u8>, CliError> {
    let mut tensors = vec![];
    for (i, g) in groups.iter().enumerate() {
        for (which, m) in [("a", &g.a), ("b", &g.b)] {
            if m.global_scale() != 1.0 {
                return Err(CliError::Invalid {
                    name: format!("g{i}.{which}"),
                    reason: "the file format has no global scale; fold it into alpha".into(),
                });
            }
            tensors.push(Owned {
                name: format!("g{i}.{which}"),
                dtype: Dtype::U8,
                shape: vec![m.rows(), m.k() / 2],
                data: m.values().to_vec(),
            });
            let (shape, data) = match layout {
                ScaleLayout::Plain => (vec![m.rows(), m.scale_cols()], m.plain_scales()),
                ScaleLayout::Blocked => (vec![m.scales().len()], m.scales().to_vec()),
            };
            tensors.push(Owned { name: format!("g{i}.{which}_scale"), dtype: Dtype::F8_E4M3, shape, data });
        }
        tensors.push(Owned {
            name: format!("g{i}.alpha"),
            dtype: Dtype::F32,
            shape: vec![],
            data: g.alpha.to_le_bytes().to_vec(),
        });
    }
    serialize(&tensors, "input")
}

/// Writes an input file.
pub fn write_groups(path: &Path, groups: &[Group], layout: ScaleLayout) -> Result<(), CliError> {
    write_bytes(path, &serialize_groups(groups, layout)?)
}
