"""The U-Net-style block of issue 31, served with the hook's defaults at 2 intra-op threads,
equals eager: conv, group norm, SiLU, average and max pooling, bilinear upsampling, a skip
concat, then ``torch.var_mean`` over (2, 3) (whose kernel, built with a thread patch since
removed, returned about 1/4095 of eager's variance at 2 threads)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from aoti_farm.cli import main


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 32, 3, padding=1)
        self.norm = torch.nn.GroupNorm(8, 32)
        self.conv2 = torch.nn.Conv2d(64, 32, 3, padding=1)

    def forward(self, x):
        h = F.silu(self.norm(self.conv1(x)))
        d = F.avg_pool2d(h, 2) + F.max_pool2d(h, 2)
        u = F.interpolate(d, scale_factor=2, mode="bilinear", align_corners=False)
        h = self.conv2(torch.cat([h, u], dim=1))
        v, m = torch.var_mean(h, dim=(2, 3), keepdim=True)
        return (h - m) / torch.sqrt(v + 1e-5), v, m


def test_unet_block_served_with_the_defaults_at_two_threads_equals_eager(tmp_path):
    import aoti_farm
    from aoti_farm.runtime import install

    torch.manual_seed(0)
    block = Block().eval()
    x = torch.randn(2, 3, 64, 64)
    trace, cache = tmp_path / "unet.json", tmp_path / "cache"
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with torch.inference_mode():
            with aoti_farm.record(str(trace)):
                block(x)
            want = block(x)
        # verification refusals are recorded and do not fail the warm
        assert main(["warm", "--model", str(trace), "--cache-dir", str(cache)]) == 0
        with install(cache_dir=str(cache), on_miss="ignore") as hook, torch.inference_mode():
            got = block(x)
            st = hook.stats()
        # every verified kernel served, whether or not it beats eager here: their values
        with install(cache_dir=str(cache), on_miss="ignore", serve="always") as hook, torch.inference_mode():
            got2 = block(x)
            st2 = hook.stats()
        assert torch.get_num_threads() == 2          # the program's count, untouched
    finally:
        torch.set_num_threads(saved)
    for w, g in zip(want, got):
        assert g.dtype == w.dtype and g.shape == w.shape and g.stride() == w.stride()
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    for w, g in zip(want, got2):
        assert g.dtype == w.dtype and g.shape == w.shape and g.stride() == w.stride()
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    assert st["calls"] > 0, st
    assert st2["hits"] >= 4, st2      # conv/silu/pooling/cat/var_mean kernels, some of them served
