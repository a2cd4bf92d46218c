# Twenty-seventh session, calls 1 and 4: the first half of the SmolLM2 GGUF (s25 call4a.sh); call1b.sh
# (call 4) or s25 call4b.sh (call 1) right after it. Carry .ab/smol/part_aa only.
#   mkdir -p .ab/smol && split -b 50000000 ~/.cache/aioinfer/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf .ab/smol/part_
#   sha256sum ~/.cache/aioinfer/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf | cut -c1-64 > .ab/smol/sha256
# Carried: .ab/smol/part_aa (50 MB); the second half goes with the next call.
mkdir -p /tmp/smol && cp .ab/smol/part_aa /tmp/smol/ && ls -la /tmp/smol
