"""The benchmarks, a folder per question they answer (kernels, cpu_step, independence,
gpu_round, serving, sim_speed, layout). Each script is a module run from the repository root,
`python -m benchmarks.<question>.<script>`, so that the scripts that share code import it by
name; each result they made is in benchmarks/results/<question>/ with its command."""
