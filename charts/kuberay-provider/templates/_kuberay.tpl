{{/* The KubeRay provider's own flags (providers/kuberay/src/main.rs). */}}
{{- define "kuberay-provider.args" -}}
- --ray-version={{ .Values.ray.version }}
- --ray-image={{ .Values.ray.image }}
{{- end -}}

{{/* What it renders: RayServices. */}}
{{- define "kuberay-provider.rules" -}}
- apiGroups: ["ray.io"]
  resources: ["rayservices"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
{{- end -}}
