set -u
W=$(ls .whl/*.whl .whl/hf/*.whl 2>/dev/null | grep -v huggingface_hub-2)
H=$(ls .whl/hf1/huggingface_hub-1*.whl .whl/hf1/httpx-*.whl .whl/hf1/httpcore-*.whl .whl/hf1/certifi-*.whl 2>/dev/null)
python3 -m pip install -q --no-index --no-deps --target .site $W $H > /dev/null 2>&1
export PYTHONPATH=$PWD/.site:$PWD PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=/tmp/fresh_triton TORCHINDUCTOR_CACHE_DIR=/tmp/fresh_inductor
L=$OUT/log.txt
date >> $L
timeout 270 python3 benchmarks/run.py --out $OUT/m --only llama_b1x16,bert_model --compile-time none --rounds 3 >> $L 2>&1; echo "models rc=$?" >> $L
date >> $L
