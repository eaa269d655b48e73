"""HiRes benchmarks: what HiRes costs against vanilla and the residual-widening peers (cost half), what it
buys at matched FLOPs (the compute ladder, `hires-hf ladder`, and the design sweep), and bf16 throughput / MFU on
a GPU. `python -m benchmarks` (from the
repository root; the installed `hires_hf` package never imports this one) regenerates `benchmarks/RESULTS.md`
and its figures."""
