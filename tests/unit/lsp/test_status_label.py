from lsp_server.config import ModelConfig
from lsp_server.server import model_label


def test_status_names_the_default_model_when_no_target_is_set():
    assert model_label(ModelConfig()) == "SmolLM2-135M"
    assert model_label(ModelConfig(target="fake")) == "fake"
    assert model_label(ModelConfig(target="/models/qwen")) == "/models/qwen"
