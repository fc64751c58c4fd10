from lsp_server.config import ModelConfig
from lsp_server.server import model_label


def test_status_names_the_bundled_pair_when_no_target_is_set():
    assert model_label(ModelConfig()) == "bundled"
    assert model_label(ModelConfig(target="fake")) == "fake"
    assert model_label(ModelConfig(target="/models/qwen")) == "/models/qwen"
