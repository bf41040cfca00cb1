//! The C header `host/include/nvfp4_gemm.h` against the C interface `host/src/capi.rs`, which it
//! declares by hand:
//!
//! - every `extern "C"` function of capi.rs (all `pub` and `#[no_mangle]`) has a prototype in the
//!   header with the same name, return type and parameters (names and C types, through [`TYPES`]),
//!   and every prototype of the header has its function;
//! - every `#[repr(C)]` struct has its `typedef struct { … } nvfp4_…;` with the same fields (names
//!   and C types, in order), every other public struct (a handle) its opaque typedef;
//! - every `#define NVFP4_*` of the header is the Rust constant of the same name, with its value,
//!   and the other way round;
//! - a C compiler (`$CC`, else `cc`; the test fails if there is none) compiles a translation unit
//!   that includes the header and asserts (`_Static_assert`) each struct's size, alignment and
//!   field offsets as Rust computes them (`size_of`, `align_of`, `offset_of!`), each constant's
//!   value, the widths of `size_t` and `int`, and initializes a pointer of the function type Rust
//!   declares with each function (so the compiler, too, checks every prototype).

use nvfp4_gemm::capi::{
    self, RawBlockDesc, RawBuffer, RawGroupArgs, RawHostBytes, RawMoeArgs, RawOperand, RawShape, RawStackedArgs,
};
use std::collections::{BTreeMap, BTreeSet};
use std::mem::{align_of, offset_of, size_of};
use std::path::PathBuf;
use std::process::Command;

const CAPI: &str = include_str!("../src/capi.rs");
const HEADER: &str = include_str!("../include/nvfp4_gemm.h");

/// Rust types of the C interface and their C names (the last path segment of the Rust type).
const TYPES: &[(&str, &str)] = &[
    ("usize", "size_t"),
    ("u8", "uint8_t"),
    ("u32", "uint32_t"),
    ("u64", "uint64_t"),
    ("i32", "int"),
    ("f32", "float"),
    ("c_char", "char"),
    ("CUstream", "nvfp4_stream"),
    ("RawBuffer", "nvfp4_buffer"),
    ("RawOperand", "nvfp4_operand"),
    ("RawGroupArgs", "nvfp4_group_args"),
    ("RawStackedArgs", "nvfp4_stacked_args"),
    ("RawMoeArgs", "nvfp4_moe_args"),
    ("RawShape", "nvfp4_shape"),
    ("Nvfp4Device", "nvfp4_device"),
    ("Nvfp4GemmPlan", "nvfp4_gemm_plan"),
    ("Nvfp4MoePlan", "nvfp4_moe_plan"),
    ("RawHostBytes", "nvfp4_host_bytes"),
    ("RawBlockDesc", "nvfp4_block_desc"),
    ("Nvfp4ExpertBlock", "nvfp4_expert_block"),
];

/// Every constant of the C interface with its value, as Rust has it.
const CONSTANTS: &[(&str, i64)] = &[
    ("NVFP4_OK", capi::NVFP4_OK as i64),
    ("NVFP4_INVALID", capi::NVFP4_INVALID as i64),
    ("NVFP4_UNSUPPORTED", capi::NVFP4_UNSUPPORTED as i64),
    ("NVFP4_NO_DRIVER", capi::NVFP4_NO_DRIVER as i64),
    ("NVFP4_DRIVER", capi::NVFP4_DRIVER as i64),
    ("NVFP4_PANIC", capi::NVFP4_PANIC as i64),
    ("NVFP4_CAPTURE", capi::NVFP4_CAPTURE as i64),
    ("NVFP4_F16", capi::NVFP4_F16 as i64),
    ("NVFP4_BF16", capi::NVFP4_BF16 as i64),
    ("NVFP4_CONTIGUOUS", capi::NVFP4_CONTIGUOUS as i64),
    ("NVFP4_MASKED", capi::NVFP4_MASKED as i64),
    ("NVFP4_TOKENS_NVFP4", capi::NVFP4_TOKENS_NVFP4 as i64),
    ("NVFP4_TOKENS_F16", capi::NVFP4_TOKENS_F16 as i64),
    ("NVFP4_TOKENS_BF16", capi::NVFP4_TOKENS_BF16 as i64),
    ("NVFP4_MODELOPT", capi::NVFP4_MODELOPT as i64),
    ("NVFP4_COMPRESSED_TENSORS", capi::NVFP4_COMPRESSED_TENSORS as i64),
    ("NVFP4_PROJECTIONS_W1_W3_W2", capi::NVFP4_PROJECTIONS_W1_W3_W2 as i64),
    ("NVFP4_PROJECTIONS_GATE_UP_DOWN", capi::NVFP4_PROJECTIONS_GATE_UP_DOWN as i64),
    ("NVFP4_RECONCILE_REFUSE", capi::NVFP4_RECONCILE_REFUSE as i64),
    ("NVFP4_RECONCILE_EXACT", capi::NVFP4_RECONCILE_EXACT as i64),
    ("NVFP4_RECONCILE_ROUND", capi::NVFP4_RECONCILE_ROUND as i64),
    ("NVFP4_SILU", capi::NVFP4_SILU as i64),
    ("NVFP4_GELU_TANH", capi::NVFP4_GELU_TANH as i64),
    ("NVFP4_RELU2", capi::NVFP4_RELU2 as i64),
    ("NVFP4_W4A4", capi::NVFP4_W4A4 as i64),
    ("NVFP4_W4A16", capi::NVFP4_W4A16 as i64),
    ("NVFP4_BLOCK_WEIGHT_AT_INPUT", capi::NVFP4_BLOCK_WEIGHT_AT_INPUT as i64),
    ("NVFP4_BLOCK_ACTIVATION_EPILOGUE", capi::NVFP4_BLOCK_ACTIVATION_EPILOGUE as i64),
    ("NVFP4_IDS_I32", capi::NVFP4_IDS_I32 as i64),
    ("NVFP4_IDS_I64", capi::NVFP4_IDS_I64 as i64),
    ("NVFP4_WEIGHTS_F32", capi::NVFP4_WEIGHTS_F32 as i64),
    ("NVFP4_WEIGHTS_BF16", capi::NVFP4_WEIGHTS_BF16 as i64),
];

/// One `#[repr(C)]` struct as Rust lays it out.
struct Layout {
    rust: &'static str,
    size: usize,
    align: usize,
    fields: Vec<(&'static str, usize)>,
}

macro_rules! layout {
    ($t:ident { $($f:ident),* $(,)? }) => {
        Layout {
            rust: stringify!($t),
            size: size_of::<$t>(),
            align: align_of::<$t>(),
            fields: vec![$((stringify!($f), offset_of!($t, $f))),*],
        }
    };
}

/// Every `#[repr(C)]` struct of capi.rs with every field (checked against the source).
fn layouts() -> Vec<Layout> {
    vec![
        layout!(RawBuffer { ptr, len }),
        layout!(RawOperand { values, scales }),
        layout!(RawGroupArgs { a, b, c, alpha }),
        layout!(RawStackedArgs { a, b, c }),
        layout!(RawMoeArgs { sizes, a, c }),
        layout!(RawShape { m, n, k }),
        layout!(RawHostBytes { data, len }),
        layout!(RawBlockDesc { first_expert, experts, top_k, max_tokens, activation, precision, dtype, flags }),
    ]
}

/// A declaration's C type as tokens (identifiers, `*`), e.g. `const nvfp4_shape *` →
/// `["const", "nvfp4_shape", "*"]`.
type CType = Vec<String>;

/// A struct's or a function's fields or parameters: (name, type).
type Fields = Vec<(String, CType)>;

/// One function: name, return type, parameters (name, type).
#[derive(Debug, Clone, PartialEq)]
struct Function {
    name: String,
    ret: CType,
    params: Fields,
}

fn c_name(rust: &str) -> &'static str {
    let last = rust.rsplit("::").next().unwrap().trim();
    match TYPES.iter().find(|(r, _)| *r == last) {
        Some((_, c)) => c,
        None => panic!("the Rust type `{rust}` has no C name: add it to TYPES in host/tests/c_header.rs"),
    }
}

/// The C type of a Rust type of the interface.
fn c_type(rust: &str) -> CType {
    let t = rust.trim();
    if let Some(inner) = t.strip_prefix("*const ") {
        let mut c = c_type(inner);
        assert!(!c.contains(&"*".to_string()), "`{rust}`: a const pointer to a pointer has no simple C spelling");
        c.insert(0, "const".into());
        c.push("*".into());
        c
    } else if let Some(inner) = t.strip_prefix("*mut ") {
        let mut c = c_type(inner);
        c.push("*".into());
        c
    } else {
        vec![c_name(t).to_string()]
    }
}

/// C text as tokens: identifiers (with digits) and single punctuation characters.
fn tokens(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    for ch in text.chars() {
        if ch.is_ascii_alphanumeric() || ch == '_' {
            word.push(ch);
            continue;
        }
        if !word.is_empty() {
            out.push(std::mem::take(&mut word));
        }
        if !ch.is_whitespace() {
            out.push(ch.to_string());
        }
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

/// `type name` (a C declaration) as (name, type).
fn c_declaration(text: &str) -> (String, CType) {
    let mut t = tokens(text);
    let name = t.pop().unwrap_or_else(|| panic!("empty declaration in the header"));
    assert!(!t.is_empty(), "`{text}`: a declaration without a type");
    (name, t)
}

/// Splits `text` at `sep` outside brackets.
fn split_top(text: &str, sep: char) -> Vec<&str> {
    let (mut depth, mut start, mut out) = (0i32, 0, Vec::new());
    for (i, ch) in text.char_indices() {
        match ch {
            '(' | '{' | '[' | '<' => depth += 1,
            ')' | '}' | ']' | '>' => depth -= 1,
            c if c == sep && depth == 0 => {
                out.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&text[start..]);
    out
}

/// The text of `src` from `open` (an opening bracket at that byte) to its closing bracket,
/// without both.
fn bracketed(src: &str, open: usize) -> &str {
    let (o, c) = match &src[open..open + 1] {
        "(" => ('(', ')'),
        "{" => ('{', '}'),
        other => panic!("`{other}` is not an opening bracket"),
    };
    let mut depth = 0;
    for (i, ch) in src[open..].char_indices() {
        if ch == o {
            depth += 1;
        } else if ch == c {
            depth -= 1;
            if depth == 0 {
                return &src[open + 1..open + i];
            }
        }
    }
    panic!("unbalanced `{o}` in the source");
}

/// capi.rs without its tests and with its comments removed.
fn rust_source() -> String {
    let src = CAPI.split("\n#[cfg(test)]\n").next().unwrap();
    src.lines().map(|l| l.split("//").next().unwrap()).collect::<Vec<_>>().join("\n")
}

/// Every `extern "C"` function of capi.rs.
fn rust_functions() -> Vec<Function> {
    let src = rust_source();
    let mut out = Vec::new();
    let marker = "extern \"C\" fn ";
    let mut from = 0;
    while let Some(at) = src[from..].find(marker).map(|i| from + i) {
        let line_start = src[..at].rfind('\n').map_or(0, |i| i + 1);
        let qualifiers = src[line_start..at].trim();
        assert!(
            qualifiers == "pub unsafe" || qualifiers == "pub",
            "`{qualifiers} extern \"C\" fn` in capi.rs: every C function is `pub` (or `pub unsafe`)"
        );
        let name_start = at + marker.len();
        let open = name_start + src[name_start..].find('(').unwrap();
        let name = src[name_start..open].trim().to_string();
        // The attributes above: `#[no_mangle]` exports the symbol under its name.
        let attributes: Vec<&str> =
            src[..line_start].lines().rev().map(str::trim).take_while(|l| l.starts_with("#[")).collect();
        assert!(attributes.contains(&"#[no_mangle]"), "`{name}` in capi.rs lacks #[no_mangle]");
        let params_text = bracketed(&src, open);
        let params = split_top(params_text, ',')
            .into_iter()
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (n, t) = p.split_once(':').unwrap_or_else(|| panic!("`{name}`: parameter `{p}`"));
                (n.trim().to_string(), c_type(t))
            })
            .collect();
        let after = open + 1 + params_text.len() + 1;
        let body = after + src[after..].find('{').unwrap();
        let ret = match src[after..body].trim().strip_prefix("->") {
            Some(t) => c_type(t),
            None => vec!["void".to_string()],
        };
        out.push(Function { name, ret, params });
        from = body;
    }
    out
}

/// The `#[repr(C)]` structs of capi.rs (Rust name, fields (name, C type)) and the names of its
/// other public structs.
fn rust_structs() -> (Vec<(String, Fields)>, Vec<String>) {
    let src = rust_source();
    let (mut repr_c, mut other) = (Vec::new(), Vec::new());
    let mut from = 0;
    while let Some(at) = src[from..].find("pub struct ").map(|i| from + i) {
        let name_start = at + "pub struct ".len();
        let open = name_start + src[name_start..].find('{').unwrap();
        let name = src[name_start..open].trim().to_string();
        let line_start = src[..at].rfind('\n').map_or(0, |i| i + 1);
        let attributes: Vec<&str> =
            src[..line_start].lines().rev().map(str::trim).take_while(|l| l.starts_with("#[")).collect();
        let body = bracketed(&src, open);
        if attributes.contains(&"#[repr(C)]") {
            let fields = split_top(body, ',')
                .into_iter()
                .map(str::trim)
                .filter(|f| !f.is_empty())
                .map(|f| {
                    let f = f.strip_prefix("pub ").unwrap_or_else(|| panic!("{name}: field `{f}` is not pub"));
                    let (n, t) = f.split_once(':').unwrap();
                    (n.trim().to_string(), c_type(t))
                })
                .collect();
            repr_c.push((name, fields));
        } else {
            other.push(name);
        }
        from = open + body.len();
    }
    (repr_c, other)
}

/// The Rust constants `pub const NVFP4_*` of capi.rs, by name (values as written).
fn rust_constant_names() -> BTreeSet<String> {
    rust_source()
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub const "))
        .map(|l| l.split(':').next().unwrap().trim().to_string())
        .filter(|n| n.starts_with("NVFP4_"))
        .collect()
}

/// What the header declares.
#[derive(Default)]
struct Header {
    defines: BTreeMap<String, i64>,
    functions: Vec<Function>,
    /// `typedef struct { … } name;`: fields (name, type).
    structs: BTreeMap<String, Fields>,
    /// `typedef struct tag name;` and `typedef struct tag *name;`: names.
    opaque: BTreeSet<String>,
}

fn header() -> Header {
    let mut h = Header::default();
    // Comments removed.
    let mut text = String::new();
    let mut rest = HEADER;
    while let Some(at) = rest.find("/*") {
        text.push_str(&rest[..at]);
        let end = rest[at..].find("*/").expect("an unterminated comment in the header");
        rest = &rest[at + end + 2..];
    }
    text.push_str(rest);
    // Preprocessor lines (the defines kept) and the C++ guard's lines removed.
    let mut code = String::new();
    for line in text.lines() {
        let l = line.trim();
        if let Some(d) = l.strip_prefix("#define ") {
            let mut parts = d.split_whitespace();
            let name = parts.next().unwrap().to_string();
            match parts.next() {
                Some(v) => {
                    let value = v.parse().unwrap_or_else(|_| panic!("#define {name} {v}: not an integer"));
                    assert!(parts.next().is_none(), "#define {name}: one integer expected");
                    assert!(name.starts_with("NVFP4_"), "#define {name}: the header's constants are NVFP4_*");
                    assert!(h.defines.insert(name.clone(), value).is_none(), "#define {name} twice");
                }
                None => assert_eq!(name, "NVFP4_GEMM_H", "a #define without a value"),
            }
        } else if !(l.starts_with('#') || l == "extern \"C\" {" || l == "}") {
            code.push_str(line);
            code.push('\n');
        }
    }
    for stmt in split_top(&code, ';').into_iter().map(str::trim).filter(|s| !s.is_empty()) {
        if let Some(t) = stmt.strip_prefix("typedef struct") {
            let t = t.trim();
            if t.starts_with('{') {
                let body = bracketed(t, 0);
                let name = t[body.len() + 2..].trim().to_string();
                let fields: Fields = split_top(body, ';')
                    .into_iter()
                    .map(str::trim)
                    .filter(|f| !f.is_empty())
                    .map(c_declaration)
                    .collect();
                assert!(h.structs.insert(name.clone(), fields).is_none(), "struct {name} twice");
            } else {
                let (name, _) = c_declaration(t);
                h.opaque.insert(name);
            }
        } else {
            let open = stmt.find('(').unwrap_or_else(|| panic!("the header's `{stmt}` is not a prototype"));
            let (name, ret) = c_declaration(&stmt[..open]);
            let params_text = bracketed(stmt, open);
            assert_eq!(stmt[open + params_text.len() + 2..].trim(), "", "`{stmt}`: text after the prototype");
            let params = if params_text.trim() == "void" {
                Vec::new()
            } else {
                split_top(params_text, ',').into_iter().map(c_declaration).collect()
            };
            assert!(!h.functions.iter().any(|f| f.name == name), "{name} declared twice");
            h.functions.push(Function { name, ret, params });
        }
    }
    h
}

fn spell(t: &CType) -> String {
    t.join(" ").replace("* *", "**")
}

#[test]
fn every_c_function_has_its_prototype_and_every_prototype_its_function() {
    let rust = rust_functions();
    let h = header();
    assert!(rust.len() >= 17, "only {} C functions found in capi.rs", rust.len());
    let names = |fs: &[Function]| fs.iter().map(|f| f.name.clone()).collect::<BTreeSet<_>>();
    let (r, c) = (names(&rust), names(&h.functions));
    assert_eq!(r.len(), rust.len(), "a C function defined twice");
    let missing: Vec<_> = r.difference(&c).collect();
    let extra: Vec<_> = c.difference(&r).collect();
    assert!(missing.is_empty(), "functions of capi.rs without a prototype in nvfp4_gemm.h: {missing:?}");
    assert!(extra.is_empty(), "prototypes of nvfp4_gemm.h without a function in capi.rs: {extra:?}");
    for f in &rust {
        let p = h.functions.iter().find(|p| p.name == f.name).unwrap();
        assert_eq!(spell(&p.ret), spell(&f.ret), "{}: return type (header, Rust)", f.name);
        assert_eq!(p.params.len(), f.params.len(), "{}: parameter count (header, Rust)", f.name);
        for (i, ((hn, ht), (rn, rt))) in p.params.iter().zip(&f.params).enumerate() {
            assert_eq!(hn, rn, "{}: name of parameter {i} (header, Rust)", f.name);
            assert_eq!(spell(ht), spell(rt), "{}: type of `{rn}` (header, Rust)", f.name);
        }
    }
}

#[test]
fn every_struct_is_declared_with_its_fields() {
    let (repr_c, handles) = rust_structs();
    let h = header();
    let declared: BTreeSet<&str> = repr_c.iter().map(|(n, _)| c_name(n)).collect();
    let in_header: BTreeSet<&str> = h.structs.keys().map(String::as_str).collect();
    assert_eq!(declared, in_header, "#[repr(C)] structs of capi.rs (left) and structs of the header (right)");
    for (name, fields) in &repr_c {
        let c = &h.structs[c_name(name)];
        let spelled = |f: &[(String, CType)]| f.iter().map(|(n, t)| format!("{} {n}", spell(t))).collect::<Vec<_>>();
        assert_eq!(spelled(c), spelled(fields), "fields of {} (header) and {name} (Rust)", c_name(name));
    }
    for name in &handles {
        assert!(
            h.opaque.contains(c_name(name)),
            "handle {name}: no `typedef struct … {};` in the header",
            c_name(name)
        );
    }
    assert!(h.opaque.contains("nvfp4_stream"), "nvfp4_stream");
    // The layouts the compiler checks cover every struct and every field.
    let layouts = layouts();
    for (name, fields) in &repr_c {
        let l = layouts.iter().find(|l| l.rust == name).unwrap_or_else(|| panic!("{name}: add it to layouts()"));
        let listed: Vec<&str> = l.fields.iter().map(|(f, _)| *f).collect();
        let source: Vec<&str> = fields.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(listed, source, "{name}: the fields of layouts() and of capi.rs");
    }
    assert_eq!(layouts.len(), repr_c.len(), "layouts() lists a struct capi.rs does not have");
}

#[test]
fn every_define_is_the_rust_constant() {
    let h = header();
    let table: BTreeMap<String, i64> = CONSTANTS.iter().map(|(n, v)| (n.to_string(), *v)).collect();
    let names: BTreeSet<String> = table.keys().cloned().collect();
    assert_eq!(
        rust_constant_names(),
        names,
        "`pub const NVFP4_*` of capi.rs (left) and CONSTANTS of this test (right)"
    );
    assert_eq!(h.defines, table, "#define NVFP4_* of the header (left) and the Rust constants (right)");
}

/// The C compiler's view: the header compiles on its own (C11, every warning an error), with
/// every layout, constant and prototype as Rust has it.
#[test]
fn a_c_compiler_agrees_with_the_rust_layouts_and_prototypes() {
    let mut c = String::from("#include \"nvfp4_gemm.h\"\n#include <stddef.h>\n\n");
    c += &format!("_Static_assert(sizeof(size_t) == {}, \"size_t is usize\");\n", size_of::<usize>());
    c += &format!("_Static_assert(sizeof(int) == {}, \"int is i32\");\n", size_of::<i32>());
    c += &format!("_Static_assert(sizeof(float) == {}, \"float is f32\");\n", size_of::<f32>());
    c += &format!("_Static_assert(sizeof(nvfp4_stream) == {}, \"a CUstream is a pointer\");\n\n", size_of::<usize>());
    for l in layouts() {
        let t = c_name(l.rust);
        c += &format!("_Static_assert(sizeof({t}) == {}, \"size of {t}\");\n", l.size);
        c += &format!("_Static_assert(_Alignof({t}) == {}, \"alignment of {t}\");\n", l.align);
        for (f, at) in &l.fields {
            c += &format!("_Static_assert(offsetof({t}, {f}) == {at}, \"offset of {t}.{f}\");\n");
        }
    }
    c += "\n";
    for (name, value) in CONSTANTS {
        c += &format!("_Static_assert({name} == {value}, \"{name}\");\n");
    }
    c += "\n";
    for f in rust_functions() {
        let params: Vec<String> = f.params.iter().map(|(_, t)| spell(t)).collect();
        let params = if params.is_empty() { "void".to_string() } else { params.join(", ") };
        c += &format!("{} (*const check_{})({}) = {};\n", spell(&f.ret), f.name, params, f.name);
    }

    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("c_header");
    std::fs::create_dir_all(&dir).unwrap();
    let source = dir.join("check.c");
    std::fs::write(&source, &c).unwrap();
    let include = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("include");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let output = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic-errors", "-c", "-o"])
        .arg(dir.join("check.o"))
        .arg("-I")
        .arg(&include)
        .arg(&source)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "no C compiler: `{cc}` could not be run ({e}). This test compiles host/include/nvfp4_gemm.h \
                 against the Rust layouts: install a C compiler (gcc or clang) or set CC."
            )
        });
    assert!(
        output.status.success(),
        "{cc} rejected {} (the header against the Rust side):\n{}{}",
        source.display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
