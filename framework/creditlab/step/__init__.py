"""The RL step and what it calls: the LightningModule (:mod:`~creditlab.step.module`), rollouts and
generation, segmenting, advantages, the losses and their aggregation, the shared-prompt forward,
credit and step metrics, the policy handle, data-parallel helpers and evaluation."""
