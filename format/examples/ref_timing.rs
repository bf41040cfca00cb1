//! Wall time of the CPU reference grouped GEMM on a benchmark shape.
//!
//! `cargo run --release -p nvfp4-format --example ref_timing [b0|b1|b2|b3] [competition|full]`
//! (default: b0, competition inputs).

use std::time::Instant;

use nvfp4_format::generate::shapes;
use nvfp4_format::{random_groups, reference_grouped_gemm, GroupShape, InputDistribution};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let name = args.first().map_or("b0", String::as_str);
    let shapes: &[GroupShape] = match name {
        "b0" => &shapes::B0,
        "b1" => &shapes::B1,
        "b2" => &shapes::B2,
        "b3" => &shapes::B3,
        other => return Err(format!("unknown shape set {other:?} (b0, b1, b2, b3)").into()),
    };
    let dist = match args.get(1).map_or("competition", String::as_str) {
        "competition" => InputDistribution::Competition,
        "full" => InputDistribution::FullRange,
        other => return Err(format!("unknown distribution {other:?} (competition, full)").into()),
    };

    let t = Instant::now();
    let groups = random_groups(shapes, dist, 1111)?;
    let gen_s = t.elapsed().as_secs_f64();

    let t = Instant::now();
    let out = reference_grouped_gemm(&groups)?;
    let ref_s = t.elapsed().as_secs_f64();

    let macs: f64 = shapes.iter().map(|s| (s.m * s.n * s.k) as f64).sum();
    let checksum: f64 = out.iter().flat_map(|c| c.data.iter()).map(|x| f64::from(x.to_f32())).sum();
    println!(
        "{name} ({} groups, {dist:?}): generate {gen_s:.2} s, reference {ref_s:.2} s on {} threads \
         ({:.2} GMAC/s); checksum {checksum:.6e}",
        shapes.len(),
        rayon::current_num_threads(),
        macs / ref_s / 1e9,
    );
    Ok(())
}
