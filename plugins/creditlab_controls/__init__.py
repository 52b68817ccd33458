"""Controls that tell credit from sampling and accounting (issue 38; DESIGN.md section 9).

Each is GRPO on GRPO's own samples with one thing changed, so that a difference against GRPO has
one cause: ``oracle_credit`` (blame of a failed chain only from the true first wrong step on),
``sham_credit`` (the same amount of blame removed at a random place), ``anti_credit`` (blame only
on the right prefix) and ``reward_flip`` (rewards flipped at a set rate: an effect of known
direction and size, to measure a comparison's power). See docs/methods/controls.md.
"""
