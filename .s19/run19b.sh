source .s14/setup.sh
export PYTHONUNBUFFERED=1
echo "[diag] $(date -u +%T)"
for nv in "" 1; do
  echo "--- NVML check '$nv'"
  OPENBLAS_NUM_THREADS=1 CUDA_VISIBLE_DEVICES= PYTORCH_NVML_BASED_CUDA_CHECK=$nv timeout 200 python3 .s19/who.py 2>&1 | grep -v Warning | tail -32
done
echo "--- CUDA_VISIBLE_DEVICES=-1"
OPENBLAS_NUM_THREADS=1 CUDA_VISIBLE_DEVICES=-1 timeout 200 python3 .s19/who.py 2>&1 | grep "\[who\] t" | tail -3
echo "[diag] $(date -u +%T)"
