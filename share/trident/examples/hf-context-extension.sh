#!/usr/bin/env bash
# A pre-trained model end to end (share/trident/models.md): Hugging Face
# directory -> trident checkpoint -> 4x longer context with cp = 2 and
# llama3-scaled RoPE -> Hugging Face directory again.
#
#   hf-context-extension.sh [HF_DIR] WORKDIR
#
# Without HF_DIR a small random LlamaForCausalLM (context 16) is written with
# numpy first. Environment: TRIDENT (default: trident on PATH), PYTHON
# (default: the repository's .venv), MPIRUN (default: mpirun -np 2 with the
# flags a root shell on one machine needs).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../.." && pwd)
trident=${TRIDENT:-trident}
python=${PYTHON:-$repo/.venv/bin/python3}
if [[ $# -eq 2 ]]; then hf=$(cd "$1" && pwd); work=$2; elif [[ $# -eq 1 ]]; then hf=; work=$1; else
  sed -n '2,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
read -r -a mpirun <<<"${MPIRUN:-mpirun --allow-run-as-root --oversubscribe --mca pml ucx --mca pml_ucx_devices any --mca pml_ucx_tls any --mca btl ^vader,openib -np 2}"
mkdir -p "$work"
work=$(cd "$work" && pwd)
cd "$work"
if [[ -z $hf ]]; then
  hf=$work/base-hf
  "$python" - "$repo/tests/unit/io" "$hf" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import hf_models as hm
c = hm.config_of("llama", scaling=None)
c["max_position_embeddings"] = 16
hm.write_model(sys.argv[2], c, hm.random_tensors(c, seed=1), dtype="BF16")
PY
fi

# 1. Hugging Face -> trident (step 0, the [model] table of the run)
"$trident" convert hf "$hf" --out base.h5 --config-out base.toml
{ sed -n '/^\[model\]/,/^$/p' base.toml; cat "$here/hf-context-extension.toml"; } >run.toml

# 2. tokens for the longer context (vocabulary of the model)
vocab=$(sed -n 's/^vocab_size = //p' base.toml)
"$python" -c "import numpy as np; np.random.default_rng(0).integers(0, $vocab, 4096).astype(np.uint16).tofile('tokens.bin')"

# 3. train at 4x the context: RoPE scaled in the run config
"${mpirun[@]}" "$trident" run run.toml --resume base.h5 \
  --set model.rope_scaling=llama3 --set model.rope_factor=4.0 \
  --set model.rope_original_max_positions=16
last=$(ls ck/ckpt_step_*.h5 | tail -1)

# 4. trident -> Hugging Face, bf16
"$trident" convert to-hf "$last" --out extended-hf --dtype bf16
"$python" - <<'PY'
import json, h5py
cfg = h5py.File("extended.h5", "r").attrs["config_toml"]
cfg = cfg.decode() if isinstance(cfg, bytes) else cfg
print("run file records:", [l for l in cfg.splitlines() if l.startswith("rope_")])
print("extended-hf/config.json rope_scaling:",
      json.load(open("extended-hf/config.json"))["rope_scaling"])
PY
