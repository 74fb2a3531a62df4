"""The modules shared by the tools beside the research core: Hugging Face input and output (hf), conversations and
their chat template (conversations), generation with the KV cache (generation), layer profiles and their plots
(profiles), one palette and layout for every figure (style), the lm-evaluation-harness tasks (tasks), the LLM judge
(judge) and progress lines for logs (progress)."""
