"""The checkpoint's optional state fields (executor/checkpoint.py optional_state): the fp16 loss
scaler's grad_scaler and the LR scheduler's lr_scheduler, saved by the runs that have one. No
launch: each restores into a fresh object where the checkpoint holds it, and where it does not
the object stays at its start and the note names the file, what is missing and the step."""

import pytest
import torch

from hybridplan.executor import checkpoint


def _ckpt(**fields):
    return checkpoint.build({}, {"class": "SGD", "state": {}, "param_groups": []}, 7, "{}", "",
                            **fields)


def _scheduler():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=1.0)
    return torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)


def test_both_fields_restore_where_saved_and_are_noted_where_not(capsys):
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale(torch.ones(()))
    scheduler = _scheduler()
    for _ in range(3):
        scheduler.optimizer.step()
        scheduler.step()
    saved = _ckpt(grad_scaler=checkpoint.scaler_state(scaler),
                  lr_scheduler=checkpoint.scheduler_state(scheduler))
    fresh_scaler, fresh_scheduler = torch.amp.GradScaler("cpu"), _scheduler()
    fresh_scaler.scale(torch.ones(()))
    checkpoint.load_scaler_state(fresh_scaler, saved, "c.pt")
    checkpoint.load_scheduler_state(fresh_scheduler, saved, "c.pt")
    assert fresh_scaler.get_scale() == 1024.0
    assert fresh_scheduler.last_epoch == 3 and fresh_scheduler.get_last_lr() == [0.125]
    assert capsys.readouterr().err == ""

    bare = _ckpt()
    assert "grad_scaler" not in bare and "lr_scheduler" not in bare
    other_scaler, other_scheduler = torch.amp.GradScaler("cpu"), _scheduler()
    checkpoint.load_scaler_state(other_scaler, bare, "c.pt")
    checkpoint.load_scheduler_state(other_scheduler, bare, "c.pt")
    assert other_scaler.get_scale() == 65536.0 and other_scheduler.last_epoch == 0
    assert capsys.readouterr().err.splitlines() == [
        "hybridplan: c.pt holds no loss scale (saved without fp16): the fp16 loss scaler starts "
        "at its initial scale 65536 at step 7",
        "hybridplan: c.pt holds no LR scheduler state (saved without lr_scheduler): the "
        "schedule starts from its first step at step 7"]


def test_without_the_object_the_field_is_ignored(capsys):
    checkpoint.load_scaler_state(None, _ckpt(), "c.pt")
    checkpoint.load_scheduler_state(None, _ckpt(), "c.pt")
    assert capsys.readouterr().err == ""
    with pytest.raises(ValueError, match=r"^c.pt: lr_scheduler.class must be the scheduler "
                                         r"resumed \(StepLR\) \(got 'LambdaLR'\)"):
        checkpoint.load_scheduler_state(_scheduler(), _ckpt(lr_scheduler={
            "class": "LambdaLR", "state": {}}), "c.pt")
