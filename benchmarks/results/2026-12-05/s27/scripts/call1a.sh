# Prepared for the next session: the SmolLM2 GGUF (98 MB) for tests/test_structured_outputs_gpu.py, in
# two back-to-back calls (the machine stays warm 30 s). Locally first:
#   mkdir -p .ab/smol && split -b 50000000 ~/.cache/aioinfer/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf .ab/smol/part_
#   sha256sum ~/.cache/aioinfer/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf | cut -c1-64 > .ab/smol/sha256
# Call A: carry [".ab/smol/part_aa"] only (50 MB); call B (call4b.sh): carry [".ab/smol/part_ab", ".ab/smol/sha256", ".whl"].
mkdir -p /tmp/smol && cp .ab/smol/part_aa /tmp/smol/ && ls -la /tmp/smol
