"""Deployment formats of a trained model: CTranslate2 (:mod:`.ctranslate2`, the export;
:mod:`.runtime`, translating and generating with it), which need the optional
``ctranslate2`` package, and a Hugging Face folder (:mod:`.huggingface`, the files made by
:mod:`transformerkit.converters`). Each is imported on use, so importing this package costs
nothing."""
