"""What a step's gradient signal is made of: `noise` (per-group gradients, the gradient noise scale and SNR with
bootstrap intervals), `group_size` (the same step at smaller G), `sampler_gap` (sampler vs trainer log-probs,
ESS) and `entropy_mechanism` (the covariance that drives entropy, and the clip events).
"""
