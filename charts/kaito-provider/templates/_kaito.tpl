{{/* The KAITO provider's own flags (providers/kaito/src/main.rs). */}}
{{- define "kaito-provider.args" -}}
- --inference-set={{ .Values.inferenceSet }}
- --node-provisioning={{ .Values.nodeProvisioning.mode }}
- --gpu-instance-type={{ .Values.nodeProvisioning.gpuInstanceType }}
- --cpu-instance-type={{ .Values.nodeProvisioning.cpuInstanceType }}
{{- end -}}

{{/* What it renders: Workspaces, InferenceSets for replicas other than 1, the vLLM
inference config ConfigMaps it owns beside the Workspaces and the Services in front of
InferenceSets. RBAC cannot scope ConfigMaps by label: the ValidatingAdmissionPolicy in
configmap-policy.yaml limits ConfigMap writes and deletes to the ones labelled
kubeairunway.ai/provider=kaito, never in kube-system. */}}
{{- define "kaito-provider.rules" -}}
- apiGroups: ["kaito.sh"]
  resources: ["workspaces", "inferencesets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["configmaps", "services"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# --inference-set=auto: one read, at start, of whether the InferenceSet CRD serves the
# version it renders.
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  resourceNames: ["inferencesets.kaito.sh"]
  verbs: ["get"]
{{- end -}}
