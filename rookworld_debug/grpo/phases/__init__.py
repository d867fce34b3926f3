"""The phases of one GRPO step, one module each, in the order a step runs them: `setup` (load the models,
data and engine; step-0 invariants), `generation` (sampling, with `decoding` and `completion_text`), `rewards`,
`advantages`, `scoring` (teacher-forced per-token log-probs, entropy and exact KL), `shared` (what a step and a
warm-up step share: sample → score → the loss record), `update` (micro-batched backward and the optimizer step;
`iterations` for μ > 1) and `evaluation` (greedy and resampled after the update, with `replay`). Records stay on
the CPU; a phase that computes with a model crosses to its device and back once.
"""
