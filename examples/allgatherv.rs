//! The tensor-factorization exchange of [Rolinger-2017] (CP-ALS on multi-GPU systems, NCCL
//! vs MPI): after each mode update, every rank owns a contiguous, irregular block of factor
//! matrix rows and every rank needs the whole matrix. MPI does it with one `MPI_Allgatherv`;
//! NCCL has no allgatherv, so NCCL users issue one broadcast per rank (the "broadcast series"
//! workaround). This example times both on the host backend.
//!
//! Message sizes come from the dataset table of [Rolinger-2017] (average per-rank message size on
//! 8 GPUs, with its min/max): NELL-2 0.28 MB (0.1-0.5), CELLAR 3.02 MB (0.6-6.3),
//! DELICIOUS 32.23 MB (0.006-152), FLICKR 95.62 MB (0.02-214). Row blocks are drawn between
//! the min and the max so that they average the table's figure; sizes are scaled by
//! `--scale` (default 1/4) to keep the host run short.
//!
//! `cargo run --release --example allgatherv -- [ranks] [scale]`

use std::time::Instant;

use relaycc::{Communicator, DeviceBuffer, Group};

/// (dataset, average MB per rank, min MB, max MB) on 8 GPUs, from the table of [Rolinger-2017].
const DATASETS: [(&str, f64, f64, f64); 4] = [
    ("NELL-2", 0.28, 0.1, 0.5),
    ("CELLAR", 3.02, 0.6, 6.3),
    ("DELICIOUS", 32.23, 0.006, 152.0),
    ("FLICKR", 95.62, 0.02, 214.0),
];

/// Per-rank block sizes (f32 elements) between `min` and `max` MB averaging `avg` MB.
fn blocks(ranks: usize, avg: f64, min: f64, max: f64, scale: f64) -> Vec<usize> {
    // A fixed skewed profile: most blocks small, a few large, as the table's min/max show.
    let w: Vec<f64> = (0..ranks).map(|r| ((r * 5 + 3) % 8) as f64 / 7.0).collect();
    let raw: Vec<f64> = w.iter().map(|x| min + (max - min) * x * x).collect();
    let mean = raw.iter().sum::<f64>() / ranks as f64;
    raw.iter()
        .map(|mb| ((mb * avg / mean).clamp(min, max) * scale * 1e6 / 4.0) as usize)
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let ranks: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(8);
    let scale: f64 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(0.25);
    let comm = Communicator::host(ranks as u32)?;
    println!(
        "{:<10} {:>12} {:>16} {:>20} {:>8}",
        "dataset", "total MB", "all_gather_v ms", "broadcast series ms", "ratio"
    );
    for (name, avg, min, max) in DATASETS {
        let counts = blocks(ranks, avg, min, max, scale);
        let total: usize = counts.iter().sum();
        let displ: Vec<usize> = counts
            .iter()
            .scan(0, |a, c| {
                let d = *a;
                *a += c;
                Some(d)
            })
            .collect();
        // Rank r updated rows displ[r]..displ[r]+counts[r] of the factor matrix.
        let owned: Vec<DeviceBuffer<f32>> = (0..ranks)
            .map(|r| comm.from_slice(r, &vec![r as f32 + 1.0; counts[r]]))
            .collect::<Result<_, _>>()?;
        let full: Vec<DeviceBuffer<f32>> = (0..ranks)
            .map(|r| comm.alloc(r, total))
            .collect::<Result<_, _>>()?;
        // Warm the plan caches of both forms, then time one round each.
        comm.all_gather_v(&owned, &full)?.wait()?;
        let t = Instant::now();
        comm.all_gather_v(&owned, &full)?.wait()?;
        let agv = t.elapsed().as_secs_f64();
        let series = |comm: &Communicator| -> Result<(), Box<dyn std::error::Error>> {
            // NCCL's workaround: one broadcast per owner into its rows of every full matrix.
            for root in 0..ranks {
                let outs = full
                    .iter()
                    .map(|f| f.slice(displ[root]..displ[root] + counts[root]))
                    .collect::<Result<Vec<_>, _>>()?;
                let g: Group<'_> = {
                    let mut g = comm.group();
                    g.broadcast(&owned[root], &outs, root)?;
                    g
                };
                g.launch()?.wait()?;
            }
            Ok(())
        };
        series(&comm)?;
        let t = Instant::now();
        series(&comm)?;
        let bs = t.elapsed().as_secs_f64();
        for (r, f) in full.iter().enumerate() {
            let v = f.to_vec()?;
            let ok = (0..ranks).all(|k| {
                v[displ[k]..displ[k] + counts[k]]
                    .iter()
                    .all(|x| *x == k as f32 + 1.0)
            });
            if !ok {
                return Err(format!("{name}: rank {r} holds a wrong factor matrix").into());
            }
        }
        println!(
            "{:<10} {:>12.2} {:>16.2} {:>20.2} {:>8.2}",
            name,
            total as f64 * 4.0 / 1e6,
            agv * 1e3,
            bs * 1e3,
            bs / agv
        );
    }
    Ok(())
}
