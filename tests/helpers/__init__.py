"""What tests share: live servers and engine settings (support), hostile inputs, tiny random models, the
deployment fixtures' constants, the eval stand-in server, System One answers, the image under test."""
