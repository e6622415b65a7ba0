"""The paper's ablations at any scale (albert_jax.study): the study's variants (variants.py), a run
trained, scored and fine-tuned in a subprocess (runner.py), the paper's findings judged on the
results (findings.py), the plots (plots.py) and DIR/report.md (report.py)."""
