"""P=1 in-process probe of the fast path (for debugging on the device)."""
import faulthandler, os, sys, tempfile
faulthandler.enable()
import torch, torch.distributed as dist
import fast_ulysses as fu
f = tempfile.NamedTemporaryFile(delete=False)
dist.init_process_group("gloo", init_method=f"file://{f.name}", rank=0, world_size=1)
print("pg ok", flush=True)
g = fu.UlyssesGroup(dist.group.WORLD, 1 << 20)
print("group ok", g.stats(), flush=True)
x = torch.randn(1, 8, 4, 64, dtype=torch.bfloat16, device="cuda")
y = g.all_to_all_single_4d(x, 0, "t")
print("call ok", flush=True)
print(torch.equal(y.cpu(), fu.simulate([x.cpu()], 0)[0]), flush=True)
b = g.all_to_all_single_4d_borrowed(x, 0, "b")
print(torch.equal(b.cpu(), x.cpu()), flush=True)
g.destroy(); print("destroy ok", flush=True)
