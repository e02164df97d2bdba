"""Images: decoding (CPU, or nvJPEG on the GPU), batched transforms, and augmentation fused with decoding."""
