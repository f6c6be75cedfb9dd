"""Networks both vision families build on, and how published weights map onto them.

    resnet.py              ResNet v1.5: the classifier (registered by
                           vision/classification/resnet.py) and, with include_top=False,
                           the detectors' backbone (vision/detection/backbone.py)
    resnet_torchvision.py  torchvision/timm ResNet state dicts -> our ResNet's variables
    resnet_keras_hub.py    keras-hub's ResNetBackbone (config, h5 layer order) -> ours
    resnet_model_garden.py Model Garden's ResNet backbone (object paths, options) -> ours

The families' importers (their torchvision.py, keras_hub.py, model_garden.py) register the
name maps; these modules only build them.
"""
