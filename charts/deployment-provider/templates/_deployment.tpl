{{/* The Deployment provider's own flags (providers/deployment/src/cli.rs). */}}
{{- define "deployment-provider.args" -}}
- --vllm-image={{ .Values.engineImages.vllm }}
- --sglang-image={{ .Values.engineImages.sglang }}
- --llamacpp-image={{ .Values.engineImages.llamacpp }}
- --llamacpp-gpu-image={{ .Values.engineImages.llamacppGpu }}
{{- end -}}

{{/* What it renders: a Deployment and a Service per ModelDeployment (server-side apply; a
read of each before it first creates it, to leave alone one it does not own). Its upstream
is the built-in Deployment kind: no CRD defines it (the runtime's watch of the CRD
deployments.apps finds none), so it is found by discovery and the OpenAPI v3 document,
which every authenticated user may read through system:discovery. */}}
{{- define "deployment-provider.rules" -}}
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
{{- end -}}
