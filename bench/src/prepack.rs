//! The W4A16 prepack rows (`--prepack`, `--prepack-shape`): the GPU prepack
//! (`nvfp4_gemm::w4a16::Prepacker`) of a whole expert weight tensor, timed against the measured
//! copy rate. The default rows are DeepSeek-V3's two W4A16 expert tensors: `ds-w2`, 256 experts
//! of 7168 × 2048 (the down projection), and `ds-w1`, 256 experts of 2048 × 7168 (each of the
//! gate and up projections). Per row and activation type (f16, bf16): one checked call (experts
//! 0 and E − 1 against the CPU prepack, bit for bit), then events around one call after an L2
//! flush, median of `--iters`; GB/s = bytes read + written (values and scales, in and out) /
//! time, and that rate as a fraction of the copy ceiling (a device-to-device copy's read + write
//! bytes per second, measured at the start).

use crate::measure::{drv, stats, Bench, Result};
use crate::options::Options;
use crate::report::{aligned, Environment};
use crate::stats::Stats;
use nvfp4_format::{Nvfp4Matrix, SplitMix64};
use nvfp4_gemm::quantize::Nvfp4OperandMut;
use nvfp4_gemm::w4a16::{prepack, Activations, Prepacker, WeightStack};
use nvfp4_gemm::Nvfp4Operand;
use serde::Serialize;

/// The default rows: name and spec.
pub const PREPACK_SHAPES: [(&str, &str); 2] = [("ds-w2", "e=256,n=7168,k=2048"), ("ds-w1", "e=256,n=2048,k=7168")];

/// Distinct random experts drawn on the host; the others are device copies of them.
const DRAWN_EXPERTS: usize = 4;

/// One prepack row: a stack of `experts` matrices of `n × k`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrepackShape {
    /// Row name.
    pub name: String,
    /// Matrices in the stack.
    pub experts: usize,
    /// Rows (N) of each.
    pub n: usize,
    /// Values per row (K).
    pub k: usize,
}

impl PrepackShape {
    /// A default row by name.
    pub fn named(name: &str) -> Option<PrepackShape> {
        let (name, spec) = PREPACK_SHAPES.iter().find(|(n, _)| *n == name)?;
        let mut s = PrepackShape::parse(spec).expect("the default prepack specs are valid");
        s.name = (*name).to_owned();
        Some(s)
    }

    /// The default rows, in order.
    pub fn defaults() -> Vec<PrepackShape> {
        PREPACK_SHAPES.iter().map(|(n, _)| PrepackShape::named(n).expect("a default name")).collect()
    }

    /// Parses `e=256,n=7168,k=2048[,name=x]`. Without a name, the row is called `custom`.
    pub fn parse(spec: &str) -> std::result::Result<PrepackShape, String> {
        let (mut e, mut n, mut k, mut name) = (None, None, None, None);
        for item in spec.split(',') {
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| format!("prepack spec `{spec}`: `{item}` is not key=value (keys e, n, k, name)"))?;
            let (key, value) = (key.trim(), value.trim());
            let int = |v: &str| -> std::result::Result<usize, String> {
                v.parse().map_err(|_| format!("prepack spec `{spec}`: {key}={v} is not a whole number"))
            };
            match key {
                "e" => e = Some(int(value)?),
                "n" => n = Some(int(value)?),
                "k" => k = Some(int(value)?),
                "name" if !value.is_empty() => name = Some(value.to_owned()),
                _ => return Err(format!("prepack spec `{spec}`: unknown key `{key}` (e, n, k, name)")),
            }
        }
        let missing = |what: &str| format!("prepack spec `{spec}`: missing {what}");
        let s = PrepackShape {
            name: name.unwrap_or_else(|| "custom".into()),
            experts: e.ok_or_else(|| missing("e (experts)"))?,
            n: n.ok_or_else(|| missing("n"))?,
            k: k.ok_or_else(|| missing("k"))?,
        };
        if s.experts == 0 || s.n == 0 || s.k == 0 || s.k % 64 != 0 {
            return Err(format!("prepack spec `{spec}`: e and n must be positive, k a positive multiple of 64"));
        }
        Ok(s)
    }

    /// `e=256,n=7168,k=2048`.
    pub fn to_spec(&self) -> String {
        format!("e={},n={},k={}", self.experts, self.n, self.k)
    }

    fn stack(&self) -> WeightStack {
        WeightStack { experts: self.experts, rows: self.n, k: self.k }
    }
}

/// One row's result for one activation type.
#[derive(Debug, Clone, Serialize)]
pub struct PrepackResult {
    /// Row name.
    pub name: String,
    /// `e=..,n=..,k=..`.
    pub spec: String,
    /// `f16` or `bf16`.
    pub activations: String,
    /// Bytes read and written by one call: values and scales, in and out.
    pub bytes: u64,
    /// µs per call.
    pub us: Stats,
    /// `bytes` / median time, GB/s.
    pub gb_s: f64,
    /// `gb_s` / the copy ceiling (read + write bytes per second).
    pub of_copy: f64,
    /// What the check found (`None`: skipped with `--no-check`).
    pub check: Option<String>,
    /// The check passed (or was skipped).
    pub check_passed: bool,
}

/// The prepack table: a row per shape and activation type.
pub fn table(rows: &[PrepackResult], env: &Environment) -> String {
    let header = ["prepack", "spec", "act", "check", "ms", "GB/s", "of_copy"];
    let cells: Vec<[String; 7]> = rows
        .iter()
        .map(|r| {
            [
                r.name.clone(),
                r.spec.clone(),
                r.activations.clone(),
                match (&r.check, r.check_passed) {
                    (None, _) => "skip".into(),
                    (Some(_), true) => "PASS".into(),
                    (Some(_), false) => "FAIL".into(),
                },
                format!("{:.3}", r.us.median * 1e-3),
                format!("{:.0}", r.gb_s),
                format!("{:.0}%", 100.0 * r.of_copy),
            ]
        })
        .collect();
    let mut out = format!(
        "W4A16 prepack on the GPU (events around one call after an L2 flush, median; GB/s = bytes read + written / time; of_copy: against the copy ceiling, {:.2} TB/s)\n",
        env.copy_tb_s
    );
    out += &aligned(&header, &cells);
    for r in rows {
        if let Some(c) = &r.check {
            out += &format!("{} {}: {c}\n", r.name, r.activations);
        }
    }
    out
}

impl Bench {
    /// Times the GPU prepack of `shape` for f16 and bf16 activations ([`table`]'s rows). Device
    /// memory: the stack twice (in and out), e.g. 2 × 2.1 GB for `ds-w2`; the inputs are
    /// [`DRAWN_EXPERTS`] random experts, copied on the device into every expert's place.
    pub fn prepack_shape(
        &mut self,
        shape: &PrepackShape,
        o: &Options,
        env: &Environment,
        step: &mut dyn FnMut(&str),
    ) -> Result<Vec<PrepackResult>> {
        step("drawing and uploading the weights");
        let lib = |during: &'static str| move |e: nvfp4_gemm::Error| format!("W4A16 prepack {during}: {e}");
        let stack = shape.stack();
        let sizes = stack.sizes().map_err(lib("sizes"))?;
        let (per_v, per_s) = (sizes.values / stack.experts, sizes.scales / stack.experts);
        let drawn = DRAWN_EXPERTS.min(stack.experts);
        let mut rng = SplitMix64::new(o.seed ^ 0x9E9A);
        let mut values = vec![0u8; drawn * per_v];
        rng.fill_bytes(&mut values);
        let scales = rng.e4m3_bytes(drawn * per_s);
        let prepacker = Prepacker::new(&self.gpu).map_err(lib("setup"))?;
        let stream = self.timer.stream().clone();
        let (drawn_v, drawn_s) = (
            stream.clone_htod(&values).map_err(drv("uploading the weights"))?,
            stream.clone_htod(&scales).map_err(drv("uploading the weights"))?,
        );
        let alloc = |n: usize| stream.alloc_zeros::<u8>(n).map_err(drv("allocating the prepack buffers"));
        let (mut in_v, mut in_s, mut out_v, mut out_s) =
            (alloc(sizes.values)?, alloc(sizes.scales)?, alloc(sizes.values)?, alloc(sizes.scales)?);
        for e in 0..stack.experts {
            let d = e % drawn;
            let copy = drv("copying the weights");
            stream
                .memcpy_dtod(
                    &drawn_v.slice(d * per_v..(d + 1) * per_v),
                    &mut in_v.slice_mut(e * per_v..(e + 1) * per_v),
                )
                .map_err(copy)?;
            stream
                .memcpy_dtod(
                    &drawn_s.slice(d * per_s..(d + 1) * per_s),
                    &mut in_s.slice_mut(e * per_s..(e + 1) * per_s),
                )
                .map_err(drv("copying the weights"))?;
        }
        drop((drawn_v, drawn_s));
        let bytes = 2 * (sizes.values + sizes.scales) as u64;
        let mut results = vec![];
        for act in [Activations::F16, Activations::Bf16] {
            let name = if act == Activations::Bf16 { "bf16" } else { "f16" };
            step(&format!("{name}: check and timing"));
            // The checked call: experts 0 and E − 1 against the CPU prepack of their inputs.
            stream.memset_zeros(&mut out_v).map_err(drv("clearing the output"))?;
            stream.memset_zeros(&mut out_s).map_err(drv("clearing the output"))?;
            {
                let input = Nvfp4Operand { values: &in_v, scales: &in_s };
                let out = Nvfp4OperandMut { values: &mut out_v, scales: &mut out_s };
                prepacker.prepack(&stream, input, stack, act, out).map_err(lib("call"))?;
            }
            let (check, check_passed) = if o.check {
                let mut bad = vec![];
                for e in [0, stack.experts - 1] {
                    let d = e % drawn;
                    let m = Nvfp4Matrix::new(
                        stack.rows,
                        stack.k,
                        values[d * per_v..(d + 1) * per_v].to_vec(),
                        scales[d * per_s..(d + 1) * per_s].to_vec(),
                        1.0,
                    )
                    .map_err(|e| format!("W4A16 prepack check: {e}"))?;
                    let want = prepack(&m, act).map_err(lib("check"))?;
                    let got_v =
                        stream.clone_dtoh(&out_v.slice(e * per_v..(e + 1) * per_v)).map_err(drv("downloading"))?;
                    let got_s =
                        stream.clone_dtoh(&out_s.slice(e * per_s..(e + 1) * per_s)).map_err(drv("downloading"))?;
                    if got_v != want.values || got_s != want.scales {
                        bad.push(e);
                    }
                }
                let text = if bad.is_empty() {
                    format!("experts 0 and {} equal the CPU prepack bit for bit", stack.experts - 1)
                } else {
                    format!("experts {bad:?} differ from the CPU prepack")
                };
                (Some(text), bad.is_empty())
            } else {
                (None, true)
            };
            let mut call = || {
                let input = Nvfp4Operand { values: &in_v, scales: &in_s };
                let out = Nvfp4OperandMut { values: &mut out_v, scales: &mut out_s };
                prepacker.prepack(&stream, input, stack, act, out).map_err(lib("call"))
            };
            let samples = self.timer.each(1, o.iters, true, &mut call)?;
            let us = stats(&samples, "prepack")?;
            let gb_s = bytes as f64 / (us.median * 1e-6) / 1e9;
            results.push(PrepackResult {
                name: shape.name.clone(),
                spec: shape.to_spec(),
                activations: name.into(),
                bytes,
                us,
                gb_s,
                of_copy: gb_s / (env.copy_tb_s * 1e3),
                check,
                check_passed,
            });
        }
        Ok(results)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn default_rows_and_specs() {
        let d = PrepackShape::defaults();
        assert_eq!(d.len(), 2);
        assert_eq!((d[0].name.as_str(), d[0].experts, d[0].n, d[0].k), ("ds-w2", 256, 7168, 2048));
        assert_eq!((d[1].name.as_str(), d[1].experts, d[1].n, d[1].k), ("ds-w1", 256, 2048, 7168));
        assert_eq!(d[0].to_spec(), "e=256,n=7168,k=2048");
        let s = PrepackShape::parse("e=8, n=130, k=192, name=tail").unwrap();
        assert_eq!(s, PrepackShape { name: "tail".into(), experts: 8, n: 130, k: 192 });
        assert_eq!(PrepackShape::parse("e=1,n=8,k=64").unwrap().name, "custom");
        assert!(PrepackShape::parse("e=1,n=8").unwrap_err().contains("missing k"));
        assert!(PrepackShape::parse("e=1,n=8,k=96").unwrap_err().contains("multiple of 64"));
        assert!(PrepackShape::parse("e=1,n=8,k=64,t=2").unwrap_err().contains("unknown key `t`"));
    }

    /// Two rows of `ds-w2` (f16 at 1.2 ms, bf16 at 1.5 ms) against a 4.3 TB/s copy rate.
    pub(crate) fn rows() -> Vec<PrepackResult> {
        let r = |act: &str, us: f64| PrepackResult {
            name: "ds-w2".into(),
            spec: "e=256,n=7168,k=2048".into(),
            activations: act.into(),
            bytes: 4_227_858_432,
            us: Stats { median: us, min: us, max: us, mean: us, n: 1 },
            gb_s: 4_227_858_432.0 / (us * 1e-6) / 1e9,
            of_copy: 4_227_858_432.0 / (us * 1e-6) / 1e9 / 4300.0,
            check: Some("experts 0 and 255 equal the CPU prepack bit for bit".into()),
            check_passed: true,
        };
        vec![r("f16", 1200.0), r("bf16", 1500.0)]
    }

    #[test]
    fn table_rows() {
        let env = crate::report::tests::sample().environment;
        let t = table(&rows(), &env);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("W4A16 prepack on the GPU") && lines[0].contains("4.30 TB/s"), "{t}");
        assert!(lines[1].starts_with("prepack") && lines[1].ends_with("of_copy"), "{t}");
        assert!(lines[2].contains("ds-w2") && lines[2].contains("f16") && lines[2].contains("PASS"), "{t}");
        assert!(lines[2].contains("1.200") && lines[2].contains("3523") && lines[2].contains("82%"), "{t}");
        assert!(lines[4].starts_with("ds-w2 f16: experts 0 and 255"), "{t}");
        // The whole report: the prepack table after the shapes' tables, and in the JSON.
        let report = crate::report::Report { prepack: rows(), ..crate::report::tests::sample() };
        assert!(crate::report::table(&report).contains("W4A16 prepack on the GPU"));
        let v = serde_json::to_value(&report).unwrap();
        assert_eq!(v["prepack"][1]["activations"], "bf16");
        assert!(serde_json::to_value(crate::report::tests::sample()).unwrap().get("prepack").is_none());
        assert!(!crate::report::Report {
            prepack: vec![PrepackResult { check_passed: false, ..rows()[0].clone() }],
            ..report
        }
        .passed());
    }
}
