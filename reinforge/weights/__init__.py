"""Weight sync: moving the trainer's policy weights into the rollout engines.

One module per concern, shared by the local and Ray placements and by the vLLM / SGLang
backends (the layout of slime's ``update_weight_from_{tensor,distributed,disk}.py``):

* :mod:`.buckets`: (name, tensor) streams cut into buckets of about ``cluster.weight_sync_bucket_mb``;
  flattening a bucket into one buffer and back.
* :mod:`.groups`: the weight-sync process group (trainer rank 0 + engines) outside the trainers'
  default group, and the one broadcast call.
* Transports: :mod:`.tensor` (in-process copy or by value, same process / CPU), :mod:`.ipc`
  (CUDA IPC handles between processes on one GPU, and SGLang's serialized form),
  :mod:`.broadcast` (NCCL / gloo broadcast of flat buckets to engines on other GPUs or nodes),
  :mod:`.disk` (a Hugging Face folder the engine reloads).
* :mod:`.ray_transport`: both ends of each transport between Ray actors (sender on the trainer rank,
  receiver on the engine actor) and the Ray placement's verification; the actors only call it.

Every transport carries Hugging Face parameter names; engines load them in place and stamp
their results with the new weight version.

Every sync proves itself (docs/reliability.md#weight-sync-verification): :mod:`.verify` (exact
per-tensor checksums by the sender before each bucket goes out and by the engine where it landed,
compared; ``WeightSyncMismatch`` names bucket, parameter and transport) and :mod:`.probe` (a fixed
prompt's log-probs from engine and trainer on a schedule).
"""
