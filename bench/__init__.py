"""The bench: measures the product from outside (the product never imports it). Run each tool as
`python -m bench.NAME --help`.

    bench_kernels, bench_step, bench_scaling   the SSD alone, the training step, one GPU against several -> JSON
    first_step             train.py as a user runs it: the first step on empty caches, then the steady step
    report/                BENCHMARKS.md, the plots and README's headline block from results/*.json
    headline.sh            the three-process series behind the headline; precompile fills compile caches first
    timing, step, results, kernel_names, inputs   measuring helpers: clocks, the timed step, JSON, names, inputs
    traffic                each cuTile stage's HBM floor (bytes it must move)
    aot                    every kernel specialization compiled to cubins with no GPU
    probe_stage, probe_layer, variants, kernel_resources, ncu_ssd, operand_rounding, ab_kernels.sh
                           kernel tuning: a stage or a changed copy of it checked and timed, registers and spills,
                           Nsight Compute summaries, operand rounding, A/B across processes
    gpu_check.sh           the GPU tests dealt to parallel processes
    probes/                host-time probes (CPU --mock where they have one)
"""
