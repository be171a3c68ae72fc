"""The paper's weight diagnostics (appendix "Weight Robustness and Teacher-Quality Alignment"),
``python -m pcsd.diagnostics``:

  rank-robustness     spikes of magnitude 3.0 injected into 1 / 5 / 10 % of the valid gap positions
                      (the same positions for every rule); Spearman between each weighting rule's
                      original and perturbed weights, over seeded draws (:mod:`.robustness`)
  quality-alignment   on expert trajectories, the teacher's confidence Q on the expert action and a
                      rule's weight W, with the skills removed or replaced by another task type's;
                      Spearman of dQ vs dW per rule and perturbation, linear fits (:mod:`.alignment`)

Gaps come from a run's recorded rollouts (``run.record_gaps=true``, :mod:`pcsd.train.gaps`), from a
model scoring expert trajectories, or are synthetic. Output: rich tables, ``diagnostics.json`` and
PNG figures in the layout of the paper's two figures (:mod:`.report`). A layer above ``train``.
"""

__all__ = ["robustness", "alignment", "report", "cli"]
