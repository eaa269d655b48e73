"""HiRes benchmarks: what HiRes costs against vanilla and the residual-widening peers (cost half), what it
buys at matched FLOPs (quality half), and bf16 throughput / MFU on a GPU. `python -m benchmarks` (from the
repository root; the installed `hires_hf` package never imports this one) regenerates `benchmarks/RESULTS.md`
and its figures."""
