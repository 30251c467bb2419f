{{/* The Dynamo provider's own flags (providers/dynamo/src/main.rs). */}}
{{- define "dynamo-provider.args" -}}
- --dynamo-version={{ .Values.dynamoVersion }}
- --failed-threshold={{ .Values.failedThreshold }}
{{- end -}}

{{/* What it renders: DynamoGraphDeployments. */}}
{{- define "dynamo-provider.rules" -}}
- apiGroups: ["nvidia.com"]
  resources: ["dynamographdeployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
{{- end -}}
