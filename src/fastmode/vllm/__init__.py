"""fastmode with vLLM (docs/vllm.md), an optional extra: `pip install -e '.[vllm]'`. fastmode's own
server never imports this package."""
