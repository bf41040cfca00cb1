//! The TMA ceilings: how fast 2D TMA tile loads (the sm_90a GEMM's box shapes, on a stage ring
//! like its producer's) bring bytes into the SMs' shared memory from L2 and from DRAM, measured
//! with the kernel `xfer_tma_bandwidth` (`nvfp4_gemm_diag::ceiling`) on a persistent grid of one CTA
//! per SM. The consumers touch one word per box, so this is the memory system's rate for the
//! GEMM's access pattern with nothing else in the way.

use crate::measure::{drv, stats, Result, Timer};
use crate::stats::Stats;
use nvfp4_gemm::Gpu;
use nvfp4_gemm_diag::ceiling::{TmaBandwidth, TmaBandwidthCase, TmaBox, TMA_BW_STAGES};
use serde::Serialize;

/// Where the boxes come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Source {
    /// A buffer that stays in L2 ([`L2_BUFFER_BYTES`]), re-read many times per launch.
    L2,
    /// A buffer many times the L2 ([`DRAM_BUFFER_BYTES`]).
    Dram,
}

impl Source {
    /// `L2` or `DRAM`.
    pub fn name(self) -> &'static str {
        match self {
            Source::L2 => "L2",
            Source::Dram => "DRAM",
        }
    }
}

/// The L2 buffer: 16 MiB, a quarter of the H200's 60 MB L2.
pub const L2_BUFFER_BYTES: u64 = 16 << 20;
/// The DRAM buffer: 2 GiB.
pub const DRAM_BUFFER_BYTES: u64 = 2 << 30;
/// Bytes one launch moves from L2 (each byte of the buffer 512 times; ~1 ms at 8 TB/s).
pub const L2_LAUNCH_BYTES: u64 = 8 << 30;
/// Bytes one launch moves from DRAM (the buffer twice; ~1 ms at 4 TB/s).
pub const DRAM_LAUNCH_BYTES: u64 = 4 << 30;
/// Untimed launches before the timed ones.
const WARMUP: usize = 2;
/// Timed launches (median).
const ITERS: usize = 10;

/// The cases, the headline one of each source first: per source, the f16 token box with two boxes
/// per stage (6 × 32 KiB = 192 KiB in flight per SM, about the GEMM's 5 × 41 KiB), then one box
/// per stage (half as many bytes in flight), then the u8 weight box with four and one per stage.
pub fn cases() -> Vec<(Source, TmaBox, u32)> {
    let mut v = vec![];
    for source in [Source::L2, Source::Dram] {
        v.push((source, TmaBox::TokenF16, 2));
        v.push((source, TmaBox::TokenF16, 1));
        v.push((source, TmaBox::WeightU8, 4));
        if source == Source::L2 {
            v.push((source, TmaBox::WeightU8, 1));
        }
    }
    v
}

/// One measured TMA ceiling.
#[derive(Debug, Clone, Serialize)]
pub struct TmaCeiling {
    /// Where the boxes come from.
    pub source: Source,
    /// The box shape (`f16 64x128 sw128`, `u8 64x128 sw64`).
    pub tma_box: String,
    /// Bytes of one box.
    pub box_bytes: u32,
    /// Boxes per stage.
    pub boxes_per_stage: u32,
    /// Stages of the ring.
    pub stages: u32,
    /// Bytes in flight per CTA when every stage is loading.
    pub in_flight_bytes: u32,
    /// Bytes of the buffer the boxes walk.
    pub buffer_bytes: u64,
    /// CTAs (one per SM).
    pub ctas: u32,
    /// Bytes moved into shared memory per launch.
    pub launch_bytes: u64,
    /// µs per launch.
    pub us: Stats,
    /// `launch_bytes` / median µs, TB/s.
    pub tb_s: f64,
}

impl TmaCeiling {
    /// `f16 64x128 sw128, 6 stages x 2 boxes = 192 KiB in flight`.
    pub fn describe(&self) -> String {
        format!(
            "{}, {} stages x {} box{} = {} KiB in flight per SM",
            self.tma_box,
            self.stages,
            self.boxes_per_stage,
            if self.boxes_per_stage == 1 { "" } else { "es" },
            self.in_flight_bytes >> 10
        )
    }
}

/// The headline line: the first L2 and the first DRAM case (the f16 token box, two per stage).
pub fn headline(tma: &[TmaCeiling]) -> Option<String> {
    let l2 = tma.iter().find(|t| t.source == Source::L2)?;
    let mut s = format!("TMA L2→SM {:.2} TB/s ({})", l2.tb_s, l2.describe());
    let dram: Vec<&TmaCeiling> = tma.iter().filter(|t| t.source == Source::Dram).collect();
    if let Some(d) = dram.iter().find(|d| d.tma_box == l2.tma_box && d.boxes_per_stage == l2.boxes_per_stage) {
        s += &format!(", TMA DRAM→SM {:.2} TB/s", d.tb_s);
    } else if let Some(d) = dram.first() {
        s += &format!(", TMA DRAM→SM {:.2} TB/s ({})", d.tb_s, d.describe());
    }
    Some(s)
}

/// Measures every case of [`cases`] on `sm_count` CTAs: events around each launch (no L2 flush;
/// the L2 buffer is warm after the first launch, the DRAM buffer is 2 GiB), median of 10 after 2
/// warm-ups; then checks that every CTA received the boxes of its loads.
pub(crate) fn measure(gpu: &Gpu, timer: &mut Timer) -> Result<Vec<TmaCeiling>> {
    let stream = timer.stream().clone();
    let grid = gpu.sm_count();
    let mut out = vec![];
    for source in [Source::L2, Source::Dram] {
        let (buffer_bytes, launch_bytes) = match source {
            Source::L2 => (L2_BUFFER_BYTES, L2_LAUNCH_BYTES),
            Source::Dram => (DRAM_BUFFER_BYTES, DRAM_LAUNCH_BYTES),
        };
        let buffer = stream.alloc_zeros::<u8>(buffer_bytes as usize).map_err(drv("allocating the TMA buffer"))?;
        for (_, shape, boxes) in cases().into_iter().filter(|c| c.0 == source) {
            let case = TmaBandwidthCase::sized(shape, boxes, buffer_bytes, launch_bytes, grid);
            let what = format!("TMA {} {}", source.name(), shape.name());
            let k = TmaBandwidth::new(gpu, &stream, &buffer, case, grid).map_err(|e| format!("{what}: {e}"))?;
            let t = timer.each(WARMUP, ITERS, false, &mut || k.launch().map_err(|e| e.to_string()))?;
            let got = k.boxes_received().map_err(|e| format!("{what}: {e}"))?;
            if let Some((cta, n)) = got.iter().enumerate().find(|&(c, &n)| n != k.boxes_expected(c as u32)) {
                return Err(format!("{what}: CTA {cta} received {n} boxes, expected {}", k.boxes_expected(cta as u32)));
            }
            let us = stats(&t, &what)?;
            let launch_bytes = k.params().bytes();
            out.push(TmaCeiling {
                source,
                tma_box: shape.name().into(),
                box_bytes: shape.box_bytes(),
                boxes_per_stage: boxes,
                stages: TMA_BW_STAGES,
                in_flight_bytes: case.bytes_in_flight(),
                buffer_bytes: case.tensor_bytes(),
                ctas: grid,
                launch_bytes,
                us,
                tb_s: launch_bytes as f64 / (us.median * 1e-6) / 1e12,
            });
        }
        drop(buffer);
    }
    Ok(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn sample() -> Vec<TmaCeiling> {
        let c = |source, shape: TmaBox, boxes: u32, tb_s: f64| TmaCeiling {
            source,
            tma_box: shape.name().into(),
            box_bytes: shape.box_bytes(),
            boxes_per_stage: boxes,
            stages: TMA_BW_STAGES,
            in_flight_bytes: TMA_BW_STAGES * boxes * shape.box_bytes(),
            buffer_bytes: 16 << 20,
            ctas: 132,
            launch_bytes: 8 << 30,
            us: Stats { median: 1000.0, min: 1000.0, max: 1000.0, mean: 1000.0, n: 1 },
            tb_s,
        };
        vec![
            c(Source::L2, TmaBox::TokenF16, 2, 7.5),
            c(Source::L2, TmaBox::WeightU8, 1, 5.0),
            c(Source::Dram, TmaBox::TokenF16, 2, 3.9),
        ]
    }

    #[test]
    fn cases_fit_the_ring_and_headline() {
        let all = cases();
        assert_eq!(all.len(), 7);
        assert_eq!((all[0].0, all[0].1, all[0].2), (Source::L2, TmaBox::TokenF16, 2));
        for (source, shape, boxes) in all {
            let (buffer, bytes) = match source {
                Source::L2 => (L2_BUFFER_BYTES, L2_LAUNCH_BYTES),
                Source::Dram => (DRAM_BUFFER_BYTES, DRAM_LAUNCH_BYTES),
            };
            let case = TmaBandwidthCase::sized(shape, boxes, buffer, bytes, 132);
            assert_eq!(case.check(), Ok(()), "{case:?}");
            assert_eq!(case.tensor_bytes(), buffer, "{case:?}: the whole buffer is walked");
        }
        let h = headline(&sample()).unwrap();
        assert_eq!(
            h,
            "TMA L2→SM 7.50 TB/s (f16 64x128 sw128, 6 stages x 2 boxes = 192 KiB in flight per SM), \
             TMA DRAM→SM 3.90 TB/s"
        );
        assert_eq!(headline(&[]), None);
    }
}
