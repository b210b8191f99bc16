"""The InferenceService controller: KServe's ModelMesh-mode InferenceServices as TritonModels."""
