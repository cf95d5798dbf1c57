"""Deployment formats of a trained model: CTranslate2 (:mod:`.ctranslate2`, the export;
:mod:`.runtime`, translating and generating with it). Both need the optional
``ctranslate2`` package and are imported on use, so importing this package costs nothing."""
