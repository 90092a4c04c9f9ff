# Run by tests/it/torch/python_api.rs with real pytest and oomtrace's plugin (`-p oomtrace.pytest_plugin
# --oomtrace-simulate 16GiB`): test_clean passes its limit, test_leaks and test_too_big fail with
# the finding, test_fixture passes with the oomtrace_trace fixture.
import pytest
import torch

kept = []


def step(model, keep):
    loss = model(torch.randn(64, 256, device="cuda")).sum()
    loss.backward()
    if keep:
        kept.append(torch.empty(1 << 18, device="cuda"))  # LEAK HERE


@pytest.fixture(scope="module")
def model():
    model = torch.nn.Linear(256, 256).cuda()
    # One step first: cuBLAS's workspaces (made on the first matmul) belong to no test.
    step(model, keep=False)
    return model


@pytest.mark.oomtrace(limit="64MiB", leaks=False)
def test_clean(model):
    for _ in range(30):
        step(model, keep=False)


@pytest.mark.oomtrace(leaks=False)
def test_leaks(model):
    for _ in range(30):
        step(model, keep=True)


@pytest.mark.oomtrace(limit="8MiB")
def test_too_big(model):
    big = torch.empty(16 << 20, device="cuda")  # 64 MiB: BIG HERE
    del big


def test_fixture(model, oomtrace_trace):
    for _ in range(3):
        step(model, keep=False)
