{{- define "kubeairunway.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kubeairunway.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: controller
{{- end -}}

{{- define "kubeairunway.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end -}}

{{- define "kubeairunway.serviceAccountName" -}}
{{- default (include "kubeairunway.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "kubeairunway.webhookService" -}}
{{- printf "%s-webhook" (include "kubeairunway.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kubeairunway.webhookSecret" -}}
{{- printf "%s-webhook-tls" (include "kubeairunway.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kubeairunway.validatingWebhook" -}}
{{- printf "%s-validating" (include "kubeairunway.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kubeairunway.mutatingWebhook" -}}
{{- printf "%s-mutating" (include "kubeairunway.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kubeairunway.lease" -}}
{{- include "kubeairunway.fullname" . -}}
{{- end -}}
