# who initialises CUDA in a CPU compile (actor preload, fingerprint, one CPU compile)? stacks of torch.cuda's entry points
source .s14/setup.sh
echo "[diag] code $1, $(date -u +%FT%TZ), $(nproc) cores"
python3 .s16/cudatrace.py 2>&1 | grep -v -i warn | grep -E "^===|^---|^  File" | grep -v "frozen importlib" | head -150
